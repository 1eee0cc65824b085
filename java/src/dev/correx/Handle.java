package dev.correx;

import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongConsumer;

/**
 * A native pointer that stays valid for every call using it: calls hold the read side, and
 * {@link #close} takes the write side, so the pointer is freed only after every call on it
 * returned, and never twice. From the moment a close begins, new calls throw
 * {@link ClosedException} at once rather than queue behind it (a call in progress may be
 * waiting for one of them, from a callback).
 */
final class Handle {
    private final String what;
    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    private long ptr;
    private volatile boolean closing;

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
        if (closing) {
            throw new ClosedException(CorrexException.E_CLOSED, "this " + what + " is closed");
        }
        lock.readLock().lock();
        if (ptr == 0) {
            lock.readLock().unlock();
            throw new ClosedException(CorrexException.E_CLOSED, "this " + what + " is closed");
        }
        return new Use(ptr);
    }

    /**
     * A use that never waits: null when the handle is closed or being freed right now. For
     * calls that must get through while a close waits (a cancel).
     */
    Use tryUse() {
        if (!lock.readLock().tryLock()) {
            return null;
        }
        if (ptr == 0) {
            lock.readLock().unlock();
            return null;
        }
        return new Use(ptr);
    }

    boolean isClosed() {
        return closing;
    }

    /** Whether this thread is inside a call on the handle (a callback of it). */
    boolean usedByThisThread() {
        return lock.getReadHoldCount() > 0;
    }

    /** Waits for the calls in progress, then frees the pointer once. */
    void close(LongConsumer free) {
        if (usedByThisThread()) {
            throw new IllegalStateException("closing a " + what + " from inside a call on it (a callback) would never finish");
        }
        closing = true;
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
