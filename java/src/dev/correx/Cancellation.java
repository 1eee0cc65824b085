package dev.correx;

/**
 * Stops blocking calls (a model load, an inference, a tool run) from any thread: pass it to
 * the call, then {@link #cancel()}. Reusable after {@link #reset()}; close it when done (a
 * close waits for the calls using it to return).
 */
public final class Cancellation implements AutoCloseable {
    final Handle handle;

    /** A new, untriggered flag. */
    public Cancellation() {
        handle = new Handle("cancellation", Native.cancelNew());
    }

    /**
     * Asks every call using this flag to stop; they throw {@link CancelledException} soon after.
     * Never waits, also while a {@link #close()} waits for those calls.
     *
     * @throws ClosedException when the flag was already freed
     */
    public void cancel() {
        Handle.Use u = handle.tryUse();
        if (u == null) {
            throw new ClosedException(CorrexException.E_CLOSED, "this cancellation is closed");
        }
        try (u) {
            Native.cancelTrigger(u.ptr);
        }
    }

    /** Clears the flag so it can be used again. */
    public void reset() {
        try (Handle.Use u = handle.use()) {
            Native.cancelReset(u.ptr);
        }
    }

    /** Whether a close began. */
    public boolean isClosed() {
        return handle.isClosed();
    }

    /** Frees the flag, after the calls using it returned. Idempotent. */
    @Override
    public void close() {
        handle.close(Native::cancelFree);
    }
}
