"""mgpu: a multi-node GPU job scheduler.

from mgpu import Client
c = Client("127.0.0.1:8080")
job = c.submit("python train.py", gpus=2, name="train")
c.wait(job.id); print(c.logs(job.id))
"""

from mgpu.client.api import Client, MgpuError, SubmittedJob

__all__ = ["Client", "MgpuError", "SubmittedJob"]
__version__ = "0.1.0"
