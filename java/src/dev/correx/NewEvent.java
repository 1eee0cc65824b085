package dev.correx;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An event to append: its type, schema version and payload (any JSON value: a {@code Map},
 * {@code List}, string, number, boolean or null), with an optional id (appending the same id
 * again stores nothing) and correlation and causation ids.
 */
public record NewEvent(
        String typeId, int schemaVersion, Object payload, String eventId, String correlationId, String causationId) {

    /** An event of schema version 1 with a fresh id. */
    public static NewEvent of(String typeId, Object payload) {
        return new NewEvent(typeId, 1, payload, null, null, null);
    }

    /** As {@link #of}, the payload given as JSON text. */
    public static NewEvent ofJson(String typeId, String payloadJson) {
        return of(typeId, Json.parse(payloadJson));
    }

    /** This event with the given id. */
    public NewEvent withEventId(String id) {
        return new NewEvent(typeId, schemaVersion, payload, id, correlationId, causationId);
    }

    /** This event with the given correlation id. */
    public NewEvent withCorrelationId(String id) {
        return new NewEvent(typeId, schemaVersion, payload, eventId, id, causationId);
    }

    Map<String, Object> toMap() {
        if (typeId == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "an event's typeId is null");
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type_id", typeId);
        m.put("schema_version", schemaVersion);
        m.put("payload", payload);
        if (eventId != null) m.put("event_id", eventId);
        if (correlationId != null) m.put("correlation_id", correlationId);
        if (causationId != null) m.put("causation_id", causationId);
        return m;
    }
}
