"""The simnpu device daemon: gRPC service, sessions, scheduler, workers, kernels."""
