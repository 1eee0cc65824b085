package dev.correx;

import java.util.Map;

/**
 * Where a background job is: running (with {@code elapsedMs}), or ended with a reason
 * ({@code exited}, {@code stopped}, {@code timed_out}, {@code session_ended},
 * {@code runtime_closed}), its exit code or signal (null when none), and its duration.
 */
public record JobStatus(boolean running, String reason, Integer exitCode, Integer signal, long elapsedMs) {

    static JobStatus from(Map<String, Object> m) {
        boolean running = "running".equals(Json.str(m, "state"));
        Object code = m.get("exit_code");
        Object sig = m.get("signal");
        return new JobStatus(
                running,
                Json.str(m, "reason"),
                code instanceof Number ? ((Number) code).intValue() : null,
                sig instanceof Number ? ((Number) sig).intValue() : null,
                Json.num(m, running ? "elapsed_ms" : "duration_ms", 0));
    }
}
