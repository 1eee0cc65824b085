package dev.correx;

import java.util.Map;

/**
 * A tool run's result: success with its output, or failure with a reason and a stable
 * {@code kind} ({@code invalid_request}, {@code not_allowed}, {@code escape}, {@code not_found},
 * {@code too_large}, {@code symlink_loop}, {@code wrong_kind}, {@code timed_out},
 * {@code cancelled}, {@code non_zero_exit}, {@code signalled}, {@code io}, {@code interrupted}, {@code conflict}, {@code other}); the
 * tool's {@code data} (the shell's exit code and streams, a listing, ...) and the whole result
 * as JSON.
 */
public record ToolResult(
        boolean success,
        String invocationId,
        String output,
        String reason,
        String kind,
        boolean recoverable,
        Map<String, Object> data,
        String json) {

    static ToolResult from(String json) {
        Map<String, Object> m = Json.parseObject(json);
        return new ToolResult(
                "success".equals(m.get("status")),
                Json.str(m, "invocation_id"),
                Json.str(m, "output"),
                Json.str(m, "reason"),
                Json.str(m, "kind"),
                Json.bool(m, "recoverable"),
                Json.obj(m, "data"),
                json);
    }
}
