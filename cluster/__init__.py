"""How API servers and workers find and talk to each other: worker membership (the directory of live workers
and their advertised state, in Redis or in process) and the internal worker protocol (request/event shapes).

No torch, no DB, no HTTP framework: imported by api/, gpu_workers/ and jobs/ alike.
"""
