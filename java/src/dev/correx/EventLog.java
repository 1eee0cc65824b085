package dev.correx;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The runtime's event log: append with an expected version, read a stream or the whole log by
 * page, subscribe. Every call blocks briefly (an append until its events are on disk) and may
 * be made from any thread.
 */
public final class EventLog {
    /** Most events one read returns, whatever is asked. */
    public static final int MAX_PAGE = 1000;

    private final Runtime runtime;

    EventLog(Runtime runtime) {
        this.runtime = runtime;
    }

    /**
     * Appends {@code events} to {@code stream} atomically.
     *
     * @throws ConflictException when {@code expected} does not hold
     * @throws InvalidArgumentException for a null or empty stream, no events, or a payload that
     *     is not JSON
     * @throws EventStoreException when the log fails
     */
    public AppendResult append(String stream, ExpectedVersion expected, List<NewEvent> events) {
        if (expected == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "expected version is null");
        }
        if (events == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "events is null");
        }
        List<Object> list = new ArrayList<>(events.size());
        for (NewEvent e : events) {
            if (e == null) {
                throw new InvalidArgumentException(CorrexException.E_NULL, "an event is null");
            }
            list.add(e.toMap());
        }
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("v", 1);
        body.put("events", list);
        byte[] s = Native.utf8(stream, "stream");
        byte[] json = Native.utf8(Json.write(body), "events");
        Map<String, Object> out;
        try (Handle.Use u = runtime.handle.use()) {
            out = Json.parseObject(Native.text(Native.eventsAppend(u.ptr, s, expected.kind, expected.version, json)));
        }
        return new AppendResult(
                Json.num(out, "first_position", 0), Json.num(out, "last_position", 0), Json.num(out, "stream_version", 0));
    }

    /** As {@link #append(String, ExpectedVersion, List)} with one event. */
    public AppendResult append(String stream, ExpectedVersion expected, NewEvent event) {
        return append(stream, expected, Collections.singletonList(event));
    }

    /** Up to {@code max} (at most {@link #MAX_PAGE}) events of {@code stream} from version {@code fromVersion}. */
    public List<Event> readStream(String stream, long fromVersion, int max) {
        byte[] s = Native.utf8(stream, "stream");
        try (Handle.Use u = runtime.handle.use()) {
            return events(Native.eventsReadStream(u.ptr, s, fromVersion, clamp(max)));
        }
    }

    /** Up to {@code max} (at most {@link #MAX_PAGE}) events of the whole log from position {@code fromPosition}. */
    public List<Event> readAll(long fromPosition, int max) {
        try (Handle.Use u = runtime.handle.use()) {
            return events(Native.eventsReadAll(u.ptr, fromPosition, clamp(max)));
        }
    }

    /** The last global position (0 for an empty log). */
    public long lastPosition() {
        try (Handle.Use u = runtime.handle.use()) {
            return Native.eventsLastPosition(u.ptr);
        }
    }

    /**
     * Every event after position {@code after} (0: from the first), appended by any thread or
     * process, in order, exactly once. Close it when done; closing the runtime closes it too.
     */
    public Subscription subscribe(long after) {
        long sub;
        try (Handle.Use u = runtime.handle.use()) {
            sub = Native.subscribe(u.ptr, after);
        }
        return runtime.track(new Subscription(sub, runtime));
    }

    private static int clamp(int max) {
        if (max < 0) {
            throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "max is negative");
        }
        return Math.min(max, MAX_PAGE);
    }

    static List<Event> events(byte[] json) {
        return Json.objects(Json.parseObject(Native.text(json)), "events", Event::from);
    }
}
