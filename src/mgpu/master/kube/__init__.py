"""Kubernetes-backed partitions: their Nodes as mgpu's nodes, their jobs as Pods.

`driver` (one partition: its watches, Nodes and links), `pods` (jobs' runs as Pods),
`podspec` (the Pod of a launch), `capacity` (what a Node offers and what others hold),
`validate` (the template checked at start).  Imported only by a master whose config has
such a partition."""
