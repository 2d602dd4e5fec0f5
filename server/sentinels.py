"""Values the session code passes around in place of replies."""

DEFERRED = object()  # a request handler's result when the reply is sent later (scheduler, waiters)
CLOSED = object()    # the outbox item that ends a session's gRPC response stream
