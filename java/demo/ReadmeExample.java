package dev.correx.demo;

import dev.correx.*;
import dev.correx.Runtime; // java.lang.Runtime shares the name
import java.nio.file.Path;
import java.util.Map;

/** The README's Java example, compiled with the tests so that it stays true. */
final class ReadmeExample {
    public static void main(String[] args) {
        try (Runtime rt = Runtime.builder().eventLog(Path.of("events.db")).fileWrite(Path.of("work")).build()) {
            rt.setApprover(req -> req.tier() <= 2 ? Decision.APPROVE : Decision.DENY);
            rt.models().load(ModelDescriptor.builder("gemma").contextSize(2048).build());
            InferenceResult r = rt.models().stream("gemma", InferenceRequest.of("Say hi."),
                    chunk -> { System.out.print(chunk.text()); return true; });
            ToolResult w = rt.tools().execute(ToolRequest.of("s1", "file_write",
                    Map.of("operation", "write", "path", "hi.txt", "content", r.text())));
            for (Event e : rt.events().readAll(1, 100)) System.out.println(e.summary());
            System.out.println(w.success());
        }
    }
}
