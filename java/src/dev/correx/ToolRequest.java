package dev.correx;

import java.util.LinkedHashMap;
import java.util.Map;

/** A tool run to ask for: session, tool, parameters, and optionally its invocation id. */
public record ToolRequest(String sessionId, String toolName, Map<String, Object> parameters, String invocationId) {

    /** A request with a generated invocation id. */
    public static ToolRequest of(String sessionId, String toolName, Map<String, Object> parameters) {
        return new ToolRequest(sessionId, toolName, parameters, null);
    }

    /** This request with the given invocation id. */
    public ToolRequest withInvocationId(String id) {
        return new ToolRequest(sessionId, toolName, parameters, id);
    }

    String toJson() {
        if (sessionId == null || toolName == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "a tool request needs a session id and a tool name");
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("session_id", sessionId);
        m.put("tool_name", toolName);
        if (invocationId != null) m.put("invocation_id", invocationId);
        m.put("parameters", parameters == null ? Map.of() : parameters);
        return Json.write(m);
    }
}
