package dev.correx;

import java.util.List;
import java.util.Map;

/**
 * A tool the runtime has: name, tier (0..3; T2 and T3 ask the approver), description,
 * operations, whether the config enabled it, and its parameters' JSON schema (usable as a
 * model tool's {@code parameters}).
 */
public record ToolInfo(
        String name, int tier, String description, List<String> operations, boolean enabled, Map<String, Object> parameters) {

    static ToolInfo from(Map<String, Object> m) {
        return new ToolInfo(
                Json.str(m, "name"),
                (int) Json.num(m, "tier", 3),
                Json.str(m, "description"),
                Json.strings(m, "operations"),
                Json.bool(m, "enabled"),
                Json.obj(m, "parameters"));
    }
}
