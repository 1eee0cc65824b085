package dev.correx;

/** A request an MCP server may send its client that only the host can answer. */
public enum McpMethod {
    /** {@code sampling/createMessage}: the server asks for a completion from the host's model. */
    SAMPLING("sampling/createMessage", 1),
    /** {@code elicitation/create}: the server asks the user for input. */
    ELICITATION("elicitation/create", 2);

    /** The JSON-RPC method name. */
    public final String method;
    final int bit;

    McpMethod(String method, int bit) {
        this.method = method;
        this.bit = bit;
    }

    static McpMethod of(String method) {
        for (McpMethod m : values()) {
            if (m.method.equals(method)) return m;
        }
        throw new IllegalArgumentException("not a host-answered MCP method: " + method);
    }
}
