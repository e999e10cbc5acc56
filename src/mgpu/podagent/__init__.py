"""mgpu's agent in a job's Pod on a Kubernetes partition: runs that job's steps
(`mgpu pod-agent`, started by the Pod itself: mgpu.master.kube.podsteps)."""

from mgpu.podagent.agent import main

__all__ = ["main"]
