package dev.correx;

import java.util.Map;

/**
 * One model the runtime holds: its state ({@code loaded}, {@code loading}, {@code unloading}),
 * server pid and port (null for a remote model), residency, inferences in flight, resident
 * memory, and the whole entry as parsed JSON.
 */
public record ModelStatus(
        String modelId, String state, Long pid, Long port, String residency, long inFlight, Long rssBytes,
        Map<String, Object> json) {

    static ModelStatus from(Map<String, Object> m) {
        return new ModelStatus(
                Json.str(m, "model_id"),
                Json.str(m, "state"),
                Json.numOrNull(m, "pid"),
                Json.numOrNull(m, "port"),
                Json.str(m, "residency"),
                Json.num(m, "in_flight", 0),
                Json.numOrNull(m, "rss_bytes"),
                m);
    }
}
