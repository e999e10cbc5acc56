"""The one error every layer may raise for the user: a sentence, shown without a traceback."""


class MgpuError(Exception):
    """Any failure the user should see as one sentence."""
