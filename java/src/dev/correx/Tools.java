package dev.correx;

import java.util.List;
import java.util.Map;

/**
 * The runtime's sandboxed tools. A run is gated by its tier (T2 and T3 ask the approver),
 * backed up, restored on failure, and recorded in the session's stream. A tool that fails, is
 * denied or is unknown is a {@link ToolResult} saying so, not an exception.
 */
public final class Tools {
    private final Runtime runtime;

    Tools(Runtime runtime) {
        this.runtime = runtime;
    }

    /** Every tool, enabled or not, by name. */
    public List<ToolInfo> list() {
        Map<String, Object> m;
        try (Handle.Use u = runtime.handle.use()) {
            m = Json.parseObject(Native.text(Native.toolsList(u.ptr)));
        }
        return Json.objects(m, "tools", ToolInfo::from);
    }

    /** Runs a tool; blocks while the approver decides and the tool runs. */
    public ToolResult execute(ToolRequest request) {
        return execute(request, null);
    }

    /**
     * As {@link #execute(ToolRequest)}, stoppable through {@code cancel}: before the tool starts
     * the run is rejected; while it runs a shell's processes are killed and files restored.
     */
    public ToolResult execute(ToolRequest request, Cancellation cancel) {
        if (request == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "request is null");
        }
        byte[] r = Native.utf8(request.toJson(), "request");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.toolExecute(u.ptr, r, c == null ? 0 : c.ptr);
        }
        return ToolResult.from(Native.text(out));
    }
}
