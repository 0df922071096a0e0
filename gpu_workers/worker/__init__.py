"""The worker process: service, HTTP app, transports, host file cache, builder."""
