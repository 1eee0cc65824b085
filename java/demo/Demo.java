package dev.correx.demo;

import dev.correx.ApprovalRequest;
import dev.correx.Decision;
import dev.correx.Event;
import dev.correx.InferenceRequest;
import dev.correx.InferenceResult;
import dev.correx.ModelDescriptor;
import dev.correx.ModelStatus;
import dev.correx.Residency;
import dev.correx.Runtime;
import dev.correx.ToolRequest;
import dev.correx.ToolResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

/**
 * The C demo's flow through the Java library: a model answers (streamed), two tools run under
 * an approver, the event log is shown. Exits 1 if any step does not do what it should.
 */
public final class Demo {
    public static void main(String[] args) throws Exception {
        Path dir = Files.createTempDirectory("correx-java-demo");
        System.out.printf("correx Java demo on JDK %s (ABI 0x%x), working in %s%n",
                System.getProperty("java.version"), Runtime.abiVersion(), dir);
        AtomicInteger asked = new AtomicInteger();
        int port = 21000 + (int) (ProcessHandle.current().pid() % 20000);
        try (Runtime rt = Runtime.builder()
                .eventLog(dir.resolve("events.db"))
                .sandboxRoot(dir.resolve("sandbox"))
                .fileWrite(dir)
                .shell("ls")
                .shellWorkingDirs(dir)
                .set("models", Map.of("port", port, "log_dir", dir.resolve("logs").toString()))
                .build()) {
            rt.setApprover((ApprovalRequest r) -> {
                asked.incrementAndGet();
                System.out.printf("  approver: %s (T%d) wants to change %s%s -> approve%n",
                        r.toolName(), r.tier(), r.paths(), r.argv() == null ? "" : ", argv " + r.argv());
                return Decision.APPROVE;
            });

            System.out.println("\nLoading gemma-3-270m...");
            rt.models().load(ModelDescriptor.builder("gemma-3-270m")
                    .residency(Residency.PERSISTENT)
                    .contextSize(2048)
                    .extraArgs("--no-jinja", "--chat-template", "gemma")
                    .build());
            for (ModelStatus s : rt.models().status()) {
                System.out.printf("  status: %s %s, pid %d, port %d, %d MiB resident%n",
                        s.modelId(), s.state(), s.pid(), s.port(), s.rssBytes() == null ? 0 : s.rssBytes() >> 20);
            }

            System.out.println("\nAsking: What is the capital of France?");
            System.out.print("  streamed: ");
            StringBuilder pieces = new StringBuilder();
            InferenceResult answer = rt.models().stream("gemma-3-270m", InferenceRequest.builder()
                    .entry("user", "What is the capital of Italy?")
                    .entry("model", "Rome.")
                    .entry("user", "What is the capital of Germany?")
                    .entry("model", "Berlin.")
                    .entry("user", "What is the capital of France?")
                    .temperature(0).seed(7).maxTokens(2)
                    .build(), chunk -> {
                        System.out.print("[" + chunk.text() + "]");
                        pieces.append(chunk.text());
                        return true;
                    });
            System.out.println();
            System.out.printf("  answer: %s%n  usage: %d prompt + %d completion tokens (%s, %d ms)%n",
                    answer.text(), answer.promptTokens(), answer.completionTokens(), answer.finishReason(), answer.latencyMs());
            if (!pieces.toString().equals(answer.text())) {
                throw new AssertionError("the streamed pieces differ from the answer");
            }

            System.out.printf("%nfile_write %s/answer.txt (T2):%n", dir);
            ToolResult w = rt.tools().execute(ToolRequest.of("demo", "file_write",
                    Map.of("operation", "write", "path", "answer.txt", "content", answer.text().trim() + "\n")));
            System.out.println("  result: " + (w.success() ? "success: " + w.output() : "failure: " + w.reason()));

            System.out.printf("%nshell ls -l %s (T2):%n", dir);
            ToolResult ls = rt.tools().execute(ToolRequest.of("demo", "shell", Map.of("argv", List.of("ls", "-l", dir.toString()))));
            System.out.println("  result: " + (ls.success() ? "success" : "failure: " + ls.reason()));
            if (ls.success()) {
                System.out.print(ls.data().get("stdout").toString().replaceAll("(?m)^", "    "));
            }

            rt.models().unload("gemma-3-270m");
            System.out.println("\nThe event log:");
            List<Event> log = rt.events().readAll(1, 1000);
            for (Event e : log) {
                System.out.printf("  #%-3d %s  %-15s  %-26s %s%n",
                        e.position(), e.timestamp(), e.streamId(), e.typeId(), e.summary());
            }
            System.out.printf("%nThe approver was asked %d times.%n", asked.get());
            if (!w.success() || !ls.success() || asked.get() != 2
                    || !Files.readString(dir.resolve("answer.txt")).equals(answer.text().trim() + "\n")) {
                throw new AssertionError("the demo did not do what it should");
            }
        } finally {
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }
}
