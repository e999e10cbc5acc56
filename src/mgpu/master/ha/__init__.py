"""Several masters on one database: the election (leadership.py) and the cluster's shared
identity (identity.py).  Above the controller, below the HTTP edge: the edge asks it who
leads, and it opens no controller itself (the edge's lifespan does, once it leads)."""
