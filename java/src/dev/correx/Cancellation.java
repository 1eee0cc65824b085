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

    /** Asks every call using this flag to stop; they throw {@link CancelledException} soon after. */
    public void cancel() {
        try (Handle.Use u = handle.use()) {
            Native.cancelTrigger(u.ptr);
        }
    }

    /** Clears the flag so it can be used again. */
    public void reset() {
        try (Handle.Use u = handle.use()) {
            Native.cancelReset(u.ptr);
        }
    }

    /** Frees the flag, after the calls using it returned. Idempotent. */
    @Override
    public void close() {
        handle.close(Native::cancelFree);
    }
}
