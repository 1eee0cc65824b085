package dev.correx;

import java.time.Duration;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Optional;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * A subscription to the event log (see {@link EventLog#subscribe}). Use it from one thread at a
 * time. {@link #next(Duration)} waits for the next event; as an {@link Iterable} (or
 * {@link #stream()}) it blocks for each event and ends when the subscription is closed, from
 * any thread (closing the runtime closes it).
 */
public final class Subscription implements AutoCloseable, Iterable<Event> {
    /** The longest one native wait lasts, so that a close is noticed promptly. */
    private static final int SLICE_MS = 100;

    private final Handle handle;
    private final Runtime runtime;

    Subscription(long ptr, Runtime runtime) {
        this.handle = new Handle("subscription", ptr);
        this.runtime = runtime;
    }

    /**
     * The next event, waiting up to {@code timeout} for one; empty when none came in time.
     *
     * @throws ClosedException when the subscription is (or gets) closed
     * @throws EventStoreException when a read fails or a stored row cannot be decoded
     */
    public Optional<Event> next(Duration timeout) {
        if (timeout == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "timeout is null");
        }
        long nanos;
        try {
            nanos = Math.max(0, timeout.toNanos());
        } catch (ArithmeticException forever) {
            nanos = Long.MAX_VALUE / 2;
        }
        long deadline = System.nanoTime() + Math.min(nanos, Long.MAX_VALUE / 2);
        while (true) {
            long left = Math.max(0, (deadline - System.nanoTime()) / 1_000_000);
            int slice = (int) Math.min(left, SLICE_MS);
            byte[] got;
            try (Handle.Use u = handle.use()) {
                got = Native.subscriptionNext(u.ptr, slice);
            }
            if (got != null) {
                return Optional.of(Event.from(Json.parseObject(Native.text(got))));
            }
            if (left <= SLICE_MS) {
                return Optional.empty();
            }
        }
    }

    /** The position of the last event delivered: subscribe again after it to resume. */
    public long position() {
        try (Handle.Use u = handle.use()) {
            return Native.subscriptionPosition(u.ptr);
        }
    }

    /** Whether it was closed. */
    public boolean isClosed() {
        return handle.isClosed();
    }

    /** Events as they come, blocking; the iteration ends when the subscription is closed. */
    @Override
    public Iterator<Event> iterator() {
        return new Iterator<>() {
            private Event ahead;

            @Override
            public boolean hasNext() {
                while (ahead == null) {
                    try {
                        ahead = Subscription.this.next(Duration.ofMillis(SLICE_MS)).orElse(null);
                    } catch (ClosedException e) {
                        return false;
                    }
                }
                return true;
            }

            @Override
            public Event next() {
                if (!hasNext()) {
                    throw new NoSuchElementException("the subscription is closed");
                }
                Event e = ahead;
                ahead = null;
                return e;
            }
        };
    }

    /** {@link #iterator()} as a sequential stream. */
    public Stream<Event> stream() {
        return StreamSupport.stream(Spliterators.spliteratorUnknownSize(iterator(), Spliterator.ORDERED), false);
    }

    /** Frees it, after a {@link #next} in progress returned (within 100 ms). Idempotent. */
    @Override
    public void close() {
        handle.close(Native::subscriptionFree);
        runtime.untrack(this);
    }
}
