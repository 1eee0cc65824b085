package dev.correx;

import java.util.Map;

/**
 * A request an MCP server sent the host (see {@link Runtime#setMcpHandler}): which server (its
 * name in the config), what it asks for, and the request's {@code params} as the server sent
 * them (JSON, and parsed).
 */
public final class McpRequest {
    private final String server;
    private final McpMethod method;
    private final String paramsJson;
    private final long answer;
    private boolean over;

    McpRequest(String server, McpMethod method, String paramsJson, long answer) {
        this.server = server;
        this.method = method;
        this.paramsJson = paramsJson;
        this.answer = answer;
    }

    /** The server's name in the config's {@code mcp_servers}. */
    public String server() {
        return server;
    }

    /** What it asks for. */
    public McpMethod method() {
        return method;
    }

    /** The request's {@code params} object as JSON. */
    public String paramsJson() {
        return paramsJson;
    }

    /** The request's {@code params}, parsed. */
    public Map<String, Object> params() {
        return Json.parseObject(paramsJson);
    }

    /**
     * Whether the request was withdrawn (the server cancelled it or is stopping, or the runtime
     * is closing): no answer is wanted any more; return soon. True once the handler returned.
     */
    public synchronized boolean isCancelled() {
        // The native answer lives only until the handler returns (end()).
        return over || Native.mcpAnswerCancelled(answer);
    }

    synchronized void end() {
        over = true;
    }
}
