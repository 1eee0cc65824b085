package dev.correx;

import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongConsumer;

/**
 * A native pointer that stays valid for every call using it: calls hold the read side, and
 * {@link #close} takes the write side, so the pointer is freed only after every call on it
 * returned, and never twice. A call after close throws {@link ClosedException}.
 */
final class Handle {
    private final String what;
    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    private long ptr;

    Handle(String what, long ptr) {
        this.what = what;
        this.ptr = ptr;
    }

    /** One use of the pointer; close it (try-with-resources) when the call returned. */
    final class Use implements AutoCloseable {
        final long ptr;

        private Use(long ptr) {
            this.ptr = ptr;
        }

        @Override
        public void close() {
            lock.readLock().unlock();
        }
    }

    Use use() {
        lock.readLock().lock();
        if (ptr == 0) {
            lock.readLock().unlock();
            throw new ClosedException(CorrexException.E_CLOSED, "this " + what + " is closed");
        }
        return new Use(ptr);
    }

    boolean isClosed() {
        lock.readLock().lock();
        try {
            return ptr == 0;
        } finally {
            lock.readLock().unlock();
        }
    }

    /** Waits for the calls in progress, then frees the pointer once. */
    void close(LongConsumer free) {
        if (lock.getReadHoldCount() > 0) {
            throw new IllegalStateException("closing a " + what + " from inside a call on it (a callback) would never finish");
        }
        lock.writeLock().lock();
        try {
            if (ptr != 0) {
                long p = ptr;
                ptr = 0;
                free.accept(p);
            }
        } finally {
            lock.writeLock().unlock();
        }
    }
}
