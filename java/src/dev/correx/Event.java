package dev.correx;

import java.util.Map;

/**
 * A recorded event: its global position, id, stream and version in it, type, schema version,
 * time (milliseconds since the epoch and RFC 3339 UTC), correlation and causation ids, payload
 * (parsed JSON: see {@link Json}) and a one-line summary for people.
 */
public record Event(
        long position,
        String eventId,
        String streamId,
        long streamVersion,
        String typeId,
        int schemaVersion,
        long timestampMs,
        String timestamp,
        String correlationId,
        String causationId,
        Object payload,
        String summary) {

    /** The payload as JSON text. */
    public String payloadJson() {
        return Json.write(payload);
    }

    static Event from(Map<String, Object> m) {
        return new Event(
                Json.num(m, "position", 0),
                Json.str(m, "event_id"),
                Json.str(m, "stream_id"),
                Json.num(m, "stream_version", 0),
                Json.str(m, "type_id"),
                (int) Json.num(m, "schema_version", 1),
                Json.num(m, "timestamp_ms", 0),
                Json.str(m, "timestamp"),
                Json.str(m, "correlation_id"),
                Json.str(m, "causation_id"),
                m.get("payload"),
                Json.str(m, "summary"));
    }
}
