package dev.correx;

/** Answers requests MCP servers send their client (see {@link Runtime#setMcpHandler}). */
@FunctionalInterface
public interface McpHandler {
    /**
     * The result object as JSON (a {@code CreateMessageResult} for sampling, an
     * {@code ElicitResult} for elicitation), or null to decline. An exception declines too, as
     * does an answer that is not a JSON object (both kept for {@link Runtime#lastCallbackError()}).
     */
    String answer(McpRequest request) throws Exception;
}
