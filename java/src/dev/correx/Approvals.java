package dev.correx;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Durable approval requests: a run whose approver answered {@link Decision#DEFER} waits as a
 * record in the log until any process decides it; the first decision wins.
 */
public final class Approvals {
    private final Runtime runtime;

    Approvals(Runtime runtime) {
        this.runtime = runtime;
    }

    /**
     * Decides request {@code requestId} of session {@code sessionId}: {@code approve} or not
     * ({@code forSession}: approve it and the session's later runs of the tool it prefixes),
     * by {@code identity} (who decides), with a denial's {@code reason} (may be null).
     *
     * @return the recorded decision as JSON: {@code {"v": 1, "decision", "decided_by",
     *     "identity", "reason", "at_ms", "position"}}
     * @throws ConflictException when it was decided already (the message names the first
     *     decision, which stands) or its deadline passed
     * @throws NotFoundException when the session has no such request
     */
    public String decideJson(String sessionId, String requestId, boolean approve, boolean forSession,
                             String identity, String reason) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("decision", approve ? (forSession ? "approve_for_session" : "approve") : "deny");
        m.put("identity", identity == null ? "" : identity);
        if (reason != null) m.put("reason", reason);
        byte[] s = Native.utf8(sessionId, "sessionId");
        byte[] id = Native.utf8(requestId, "requestId");
        byte[] d = Native.utf8(Json.write(m), "decision");
        byte[] out;
        try (Handle.Use u = runtime.handle.use()) {
            out = Native.approvalsDecide(u.ptr, s, id, d);
        }
        return Native.text(out);
    }

    /**
     * The requests of session {@code sessionId} (decided or not), or with a null session every
     * request of the log that waits ({@code all}: decided ones too), as JSON:
     * {@code {"v": 1, "requests": [{"session_id", "request_id", "tool_name", "tier",
     * "parameters", "argv", "paths", "asked_by", "requested_at_ms", "deadline_ms", "position",
     * "decision"}]}}.
     */
    public String listJson(String sessionId, boolean all) {
        byte[] s = sessionId == null ? null : Native.utf8(sessionId, "sessionId");
        byte[] out;
        try (Handle.Use u = runtime.handle.use()) {
            out = Native.approvalsList(u.ptr, s, all ? 1 : 0);
        }
        return Native.text(out);
    }
}
