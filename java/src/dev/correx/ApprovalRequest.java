package dev.correx;

import java.util.List;
import java.util.Map;

/**
 * What an approver is asked about: the tool and its tier, the session and invocation, the
 * request's parameters, every file the tool may change ({@code paths}), the shell's command
 * line ({@code argv}, null for other tools), the approval mode, a {@code notice} when a person
 * must decide it whatever the rules (an MCP tool whose definition changed since it was pinned;
 * null otherwise), and the whole request as JSON.
 */
public record ApprovalRequest(
        String toolName,
        int tier,
        String sessionId,
        String invocationId,
        String mode,
        Map<String, Object> parameters,
        List<String> paths,
        List<String> argv,
        String notice,
        String json) {

    static ApprovalRequest from(String tool, int tier, String json) {
        Map<String, Object> m = Json.parseObject(json);
        Map<String, Object> ctx = Json.obj(m, "context");
        List<String> argv = ctx.get("argv") == null ? null : Json.strings(ctx, "argv");
        return new ApprovalRequest(
                tool,
                tier,
                Json.str(m, "session_id"),
                Json.str(m, "invocation_id"),
                Json.str(ctx, "mode"),
                Json.obj(m, "parameters"),
                Json.strings(ctx, "paths"),
                argv,
                ctx.get("notice") == null ? null : Json.str(ctx, "notice"),
                json);
    }
}
