package dev.correx.test;

import dev.correx.*;
import dev.correx.Runtime;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

/**
 * The Java library's tests, with the real model and real tools: a plain main that runs every
 * test, prints each result and "N passed, N failed", and exits 1 when one failed.
 */
public final class LibraryTest {
    interface Body {
        void run() throws Exception;
    }

    private static int passed;
    private static int failed;
    private static Path dir;

    static void test(String name, Body body) {
        long t = System.nanoTime();
        try {
            body.run();
            passed++;
            System.out.printf("ok    %s (%d ms)%n", name, (System.nanoTime() - t) / 1_000_000);
        } catch (Throwable e) {
            failed++;
            System.out.printf("FAIL  %s: %s%n", name, e);
            e.printStackTrace(System.out);
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static <T extends Throwable> T expect(Class<T> type, Body body) throws Exception {
        try {
            body.run();
        } catch (Throwable e) {
            if (type.isInstance(e)) return type.cast(e);
            throw new AssertionError("expected " + type.getSimpleName() + ", got " + e, e);
        }
        throw new AssertionError("expected " + type.getSimpleName() + ", nothing was thrown");
    }

    static Runtime.Builder config(String name) throws IOException {
        Path d = dir.resolve(name);
        Files.createDirectories(d.resolve("files"));
        return Runtime.builder()
                .eventLog(d.resolve("events.db"))
                .sandboxRoot(d.resolve("sandbox"))
                .fileRead(d.resolve("files"))
                .fileWrite(d.resolve("files"))
                .shell("sleep", "echo")
                .set("models", Map.of("port", 20000 + (int) (ProcessHandle.current().pid() % 20000),
                        "log_dir", d.resolve("logs").toString(),
                        // Health checks on correx's own thread, which logs through the listener.
                        "liveness_interval_ms", 200));
    }

    /** A started thread that cancels {@code c} after 300 ms. */
    static Thread cancelSoon(Cancellation c) {
        Thread t = new Thread(() -> {
            try {
                Thread.sleep(300);
            } catch (InterruptedException ignored) {
            }
            c.cancel();
        });
        t.start();
        return t;
    }

    /** The MCP servers' install record ($CORREX_CACHE/mcp/env), or null when absent. */
    static Map<String, String> mcpEnv() throws IOException {
        String cache = System.getenv("CORREX_CACHE");
        Path base = cache != null ? Path.of(cache)
                : System.getenv("XDG_CACHE_HOME") != null ? Path.of(System.getenv("XDG_CACHE_HOME"), "correx")
                : Path.of(System.getProperty("user.home"), ".cache", "correx");
        Path env = base.resolve("mcp").resolve("env");
        if (!Files.exists(env)) return null;
        Map<String, String> m = new HashMap<>();
        for (String line : Files.readAllLines(env)) {
            int eq = line.indexOf('=');
            if (eq > 0) m.put(line.substring(0, eq), line.substring(eq + 1));
        }
        return m;
    }

    static boolean isRoot() throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("Uid:")) return line.split("\\s+")[2].equals("0");
        }
        return false;
    }

    static Map<String, Object> params(Object... kv) {
        Map<String, Object> m = new HashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    static long rssKb() throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("VmRSS:")) return Long.parseLong(line.replaceAll("[^0-9]", ""));
        }
        return -1;
    }

    static long heapUsed() throws InterruptedException {
        java.lang.Runtime r = java.lang.Runtime.getRuntime();
        for (int i = 0; i < 3; i++) {
            System.gc();
            Thread.sleep(50);
        }
        return r.totalMemory() - r.freeMemory();
    }

    static void appendFrom8Threads(EventLog log, int total) throws InterruptedException {
        List<Thread> threads = new ArrayList<>();
        AtomicReference<Throwable> error = new AtomicReference<>();
        for (int t = 0; t < 8; t++) {
            int id = t;
            Thread th = new Thread(() -> {
                try {
                    for (int i = 0; i < total / 8; i++) {
                        log.append("load-" + id, ExpectedVersion.any(), NewEvent.of("load.tick", Map.of("i", i)));
                    }
                } catch (Throwable e) {
                    error.set(e);
                }
            });
            threads.add(th);
            th.start();
        }
        for (Thread th : threads) th.join();
        if (error.get() != null) throw new AssertionError("an appender failed", error.get());
    }

    public static void main(String[] args) throws Exception {
        // A test that hangs fails the run (with every thread's stack) rather than stall CI.
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(TimeUnit.MINUTES.toMillis(10));
            } catch (InterruptedException e) {
                return;
            }
            System.out.println("FAIL  the tests did not finish in 10 minutes; threads:");
            Thread.getAllStackTraces().forEach((t, st) -> {
                System.out.println("  " + t.getName());
                for (StackTraceElement e : st) System.out.println("    at " + e);
            });
            System.out.flush();
            java.lang.Runtime.getRuntime().halt(2);
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
        dir = Files.createTempDirectory("correx-java-test");
        System.out.println("java " + System.getProperty("java.version") + ", correx ABI 0x"
                + Integer.toHexString(Runtime.abiVersion()));
        try {
            run();
        } finally {
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
        System.out.printf("%d passed, %d failed%n", passed, failed);
        System.exit(failed == 0 ? 0 : 1);
    }

    static void run() throws Exception {
        test("the loaded library has the ABI this jar was built for", () -> {
            check((Runtime.abiVersion() >> 16) == 0 && ((Runtime.abiVersion() >> 8) & 0xff) >= 2, "abi");
        });

        test("bad configs are typed exceptions naming what is wrong", () -> {
            check(expect(ConfigException.class, () -> Runtime.open("{not json")).code()
                    == CorrexException.E_CONFIG, "bad json code");
            ConfigException c = expect(ConfigException.class, () -> Runtime.open("{\"v\": 1, \"event_lgo\": \"/tmp/x\"}"));
            check(c.getMessage().contains("event_lgo"), "names the field: " + c.getMessage());
            expect(InvalidArgumentException.class, () -> Runtime.open((String) null));
            expect(InvalidArgumentException.class, () -> Runtime.open("{\"v\": 1, \"event_log\": \"/tmp/a\0b\"}"));
            expect(ToolSetupException.class, () -> Runtime.builder()
                    .eventLog(dir.resolve("setup.db")).fileRead(dir.resolve("does-not-exist")).build());
        });

        try (Runtime rt = config("events").build()) {
            EventLog log = rt.events();
            test("append, read a stream and the whole log, with typed results", () -> {
                String emoji = "caf\u00e9 \ud83d\ude80 \u0000 end";
                AppendResult a = log.append("notes", ExpectedVersion.noStream(), List.of(
                        NewEvent.of("note.added", Map.of("text", emoji)),
                        NewEvent.ofJson("note.added", "{\"text\": \"second\", \"n\": 2}").withCorrelationId("c1")));
                check(a.streamVersion() == 2 && a.lastPosition() == a.firstPosition() + 1, "append result " + a);
                List<Event> back = log.readStream("notes", 1, 10);
                check(back.size() == 2, "two events");
                @SuppressWarnings("unchecked")
                Map<String, Object> p = (Map<String, Object>) back.get(0).payload();
                check(emoji.equals(p.get("text")), "UTF-8 and NUL survive the round trip: " + p.get("text"));
                check("c1".equals(back.get(1).correlationId()), "correlation id");
                check(back.get(1).payloadJson().contains("\"n\":2"), "payload json " + back.get(1).payloadJson());
                check(back.get(0).timestamp().endsWith("Z") && back.get(0).summary() != null, "timestamp, summary");
                check(log.readAll(1, 1000).size() >= 2 && log.lastPosition() == a.lastPosition(), "read all, last");
                check(log.readStream("notes", 2, 10).size() == 1, "from version 2");
                check(log.readStream("nothing-here", 1, 10).isEmpty(), "an absent stream is empty");
            });

            test("an event id appended twice is stored once; a subscription is a stream", () -> {
                NewEvent e = NewEvent.of("note.once", Map.of("k", 1)).withEventId("java-fixed-id");
                AppendResult first = log.append("once", ExpectedVersion.any(), e);
                AppendResult again = log.append("once", ExpectedVersion.any(), e);
                check(first.equals(again), first + " vs " + again);
                check(log.readStream("once", 1, 10).size() == 1, "stored once");
                try (Subscription sub = log.subscribe(0)) {
                    List<Event> firstThree = sub.stream().limit(3).toList();
                    check(firstThree.size() == 3 && firstThree.get(0).position() == 1, "stream " + firstThree);
                }
            });

            test("a wait step is answered once by the first signal, from the log after", () -> {
                Session waiter = rt.session("java-wait");
                expect(PendingException.class, () -> waiter.waitFor("deploy", "ok", 0, null));
                Thread sender = new Thread(() -> rt.session("java-wait").signal("ok", "{\"go\": true}", "ops"));
                sender.start();
                SessionStep<String> got = waiter.waitFor("deploy", "ok", 30_000, null);
                sender.join();
                check(got.value().equals("{\"go\":true}") && !got.replayed(), "got " + got);
                SessionStep<String> again = waiter.waitFor("deploy", "ok", 0, null);
                check(again.replayed() && again.value().equals(got.value()), "again " + again);
                expect(ConflictException.class, () -> waiter.signal("ok", "1", null));
                expect(ConflictException.class, () -> waiter.waitFor("deploy", "other", 0, null));
                expect(InvalidArgumentException.class, () -> waiter.signal("", "1", null));
                expect(InvalidArgumentException.class, () -> waiter.signal("x", "{not json", null));
            });

            test("a stale expected version is a ConflictException", () -> {
                log.append("cas", ExpectedVersion.noStream(), NewEvent.of("x", null));
                log.append("cas", ExpectedVersion.exact(1), NewEvent.of("x", null));
                ConflictException c = expect(ConflictException.class,
                        () -> log.append("cas", ExpectedVersion.exact(1), NewEvent.of("x", null)));
                check(c.code() == CorrexException.E_CONFLICT, "code");
                expect(ConflictException.class, () -> log.append("cas", ExpectedVersion.noStream(), NewEvent.of("x", null)));
                check(log.readStream("cas", 1, 10).size() == 2, "nothing appended by the failures");
            });

            test("metrics are Prometheus text that counts the log", () -> {
                String text = rt.metrics();
                check(text.contains("# TYPE correx_tool_runs_total counter"), "a family: " + text);
                check(text.contains("\ncorrex_log_position " + log.lastPosition() + "\n"), "the log's position: " + text);
                check(text.contains("correx_log_append_duration_seconds_count "), "append latency: " + text);
            });

            test("lone surrogates and endless timeouts are handled", () -> {
                expect(InvalidArgumentException.class, () -> log.append("bad\ud800", ExpectedVersion.any(), NewEvent.of("x", 1)));
                log.append("forever", ExpectedVersion.any(), NewEvent.of("x", 1));
                try (Subscription sub = log.subscribe(log.lastPosition() - 1)) {
                    check(sub.next(Duration.ofMillis(Long.MAX_VALUE)).isPresent(), "an event");
                }
            });

            test("bad input gives exceptions, never a crash", () -> {
                expect(InvalidArgumentException.class, () -> log.append(null, ExpectedVersion.any(), NewEvent.of("x", 1)));
                expect(InvalidArgumentException.class, () -> log.append("", ExpectedVersion.any(), NewEvent.of("x", 1)));
                expect(InvalidArgumentException.class, () -> log.append("s", ExpectedVersion.any(), List.of()));
                expect(InvalidArgumentException.class, () -> log.append("s", null, NewEvent.of("x", 1)));
                expect(InvalidArgumentException.class, () -> log.append("s", ExpectedVersion.any(), (List<NewEvent>) null));
                expect(InvalidArgumentException.class, () -> log.append("s", ExpectedVersion.any(), NewEvent.of(null, 1)));
                expect(InvalidArgumentException.class, () -> log.append("s", ExpectedVersion.any(), NewEvent.of("", 1)));
                expect(InvalidArgumentException.class, () -> NewEvent.ofJson("x", "{bad"));
                expect(InvalidArgumentException.class, () -> log.append("s", ExpectedVersion.any(), NewEvent.of("x", new Object())));
                expect(InvalidArgumentException.class, () -> log.readStream(null, 1, 10));
                expect(InvalidArgumentException.class, () -> log.readAll(1, -1));
                expect(InvalidArgumentException.class, () -> ExpectedVersion.exact(-1));
                expect(InvalidArgumentException.class, () -> rt.tools().execute(null));
                expect(InvalidArgumentException.class, () -> rt.tools().execute(ToolRequest.of(null, "file_read", Map.of())));
                expect(InvalidArgumentException.class, () -> rt.models().infer(null, InferenceRequest.of("x")));
                expect(InvalidArgumentException.class, () -> rt.models().infer("m", InferenceRequest.ofJson("{not json")));
                expect(InvalidArgumentException.class, () -> rt.models().loadJson("{\"v\": 1}", null));
                expect(InvalidArgumentException.class, () -> rt.models().load(null));
                check(log.readStream("s", 1, 10).isEmpty(), "nothing appended");
            });

            test("a subscription delivers events appended by another thread, in order, once", () -> {
                long start = log.lastPosition();
                try (Subscription sub = log.subscribe(start)) {
                    check(sub.next(Duration.ofMillis(50)).isEmpty(), "nothing yet");
                    Thread writer = new Thread(() -> {
                        for (int i = 0; i < 20; i++) log.append("feed", ExpectedVersion.any(), NewEvent.of("feed.i", i));
                    });
                    writer.start();
                    List<Long> got = new ArrayList<>();
                    for (Event e : sub) {
                        check(e.position() > start, "after the start");
                        got.add(((Number) e.payload()).longValue());
                        if (got.size() == 20) break;
                    }
                    writer.join();
                    for (int i = 0; i < 20; i++) check(got.get(i) == i, "in order: " + got);
                    check(sub.position() == log.lastPosition(), "position");
                    check(sub.next(Duration.ZERO).isEmpty(), "nothing twice");
                }
            });

            test("10,000 appends from 8 Java threads leave heap and native memory flat", () -> {
                appendFrom8Threads(log, 10_000);
                long heap0 = heapUsed();
                appendFrom8Threads(log, 10_000);
                long rss0 = rssKb();
                for (int round = 0; round < 3; round++) {
                    appendFrom8Threads(log, 10_000);
                }
                long rss1 = rssKb();
                long heap1 = heapUsed();
                System.out.printf("      after 20,000 appends: heap %d KiB, rss %d KiB; after 50,000: heap %d KiB, rss %d KiB%n",
                        heap0 >> 10, rss0, heap1 >> 10, rss1);
                check(log.readStream("load-7", 1, 1).size() == 1, "appended");
                // A leak of 100 bytes an append would show as 3 MB here.
                check(heap1 - heap0 < 2L << 20, "the heap grew by " + ((heap1 - heap0) >> 10) + " KiB");
                check(rss1 - rss0 < 3L << 10, "native memory grew by " + (rss1 - rss0) + " KiB");
            });
        }

        test("JSON is read and written strictly", () -> {
            for (String bad : new String[] {"01", "-", "1.", ".5", "1e", "\"\\u+041\"", "\"\\u-001\"", "1e400", "[1,]", "{\"a\" 1}", "tru"}) {
                expect(InvalidArgumentException.class, () -> Json.parse(bad));
            }
            check(Json.parse("-0.5e2").equals(-50.0) && Json.parse("12").equals(12L), "numbers");
            check(Json.parse("\"\\ud83d\\ude80 \\u00e9\"").equals("\ud83d\ude80 \u00e9"), "escapes");
            check(Json.write(Map.of("f", 0.1f)).equals("{\"f\":0.1}"), "a float " + Json.write(Map.of("f", 0.1f)));
            check(Json.write(List.of("a\"b\n", 1, true)).equals("[\"a\\\"b\\n\",1,true]"), "strings");
            check(Json.parse(Json.write(Map.of("k", List.of(1L, "x")))).equals(Map.of("k", List.of(1L, "x"))), "round trip");
        });

        test("a runtime opens from a map config too", () -> {
            Path d = dir.resolve("map");
            Files.createDirectories(d);
            try (Runtime rt = Runtime.open(Map.of("event_log", d.resolve("events.db").toString()))) {
                check(rt.events().lastPosition() == 0 && !rt.isClosed(), "fresh log");
            }
        });

        test("an MCP server's held tools are pinned by the host; an unknown server is not found", () -> {
            Path d = dir.resolve("pins");
            Files.createDirectories(d);
            // Lazy: the server is never started, as pinning reads only the log.
            Map<String, Object> server = Map.of("command", List.of("/bin/false"));
            try (Runtime rt = Runtime.open(Map.of("event_log", d.resolve("events.db").toString(),
                    "mcp_servers", Map.of("p", server)))) {
                String none = rt.pinMcpToolsJson("p");
                check(none.contains("\"pinned\":{}"), "pinned with nothing held: " + none);
                expect(NotFoundException.class, () -> rt.pinMcpToolsJson("q", "fetch"));
                check(rt.events().lastPosition() == 0, "nothing held, nothing recorded");
            }
        });

        test("a callback calling its runtime while a close waits gets ClosedException, not a hang", () -> {
            Runtime rt = config("reentry").build();
            AtomicReference<String> seen = new AtomicReference<>("not asked");
            CountDownLatch asked = new CountDownLatch(1);
            rt.setApprover(r -> {
                asked.countDown();
                while (!rt.isClosed()) Thread.sleep(5);
                try {
                    rt.events().lastPosition();
                    seen.set("answered");
                } catch (ClosedException e) {
                    seen.set("closed");
                }
                return Decision.APPROVE;
            });
            Thread runner = new Thread(() -> rt.tools().execute(ToolRequest.of("s", "file_write",
                    params("operation", "write", "path", "r.txt", "content", "x"))));
            runner.start();
            check(asked.await(20, TimeUnit.SECONDS), "the approver was never asked");
            Thread closer = new Thread(rt::close);
            closer.start();
            closer.join(20_000);
            runner.join(20_000);
            check(!closer.isAlive() && !runner.isAlive(), "a close and a callback deadlocked");
            check(seen.get().equals("closed"), "the callback saw " + seen.get());
        });

        test("a cancel gets through while a close of its flag waits for the call using it", () -> {
            try (Runtime rt = config("cancel-close").build()) {
                rt.setApprover(r -> Decision.APPROVE);
                Cancellation c = new Cancellation();
                AtomicReference<ToolResult> result = new AtomicReference<>();
                Thread runner = new Thread(() -> result.set(rt.tools().execute(
                        ToolRequest.of("s", "shell", params("argv", List.of("sleep", "30"))), c)));
                runner.start();
                while (rt.events().readStream("session-s", 1, 10).stream().noneMatch(e -> e.typeId().equals("tool.execution_started"))) {
                    Thread.sleep(5);
                }
                Thread closer = new Thread(c::close);
                closer.start();
                while (!c.isClosed()) Thread.sleep(5);
                c.cancel();
                runner.join(10_000);
                closer.join(10_000);
                check(!runner.isAlive() && !closer.isAlive(), "still waiting");
                check("cancelled".equals(result.get().kind()), "result " + result.get());
                expect(ClosedException.class, c::cancel);
            }
        });

        test("closing the runtime ends a subscription another thread waits in", () -> {
            Runtime rt = config("close").build();
            Subscription sub = rt.events().subscribe(0);
            CountDownLatch waiting = new CountDownLatch(1);
            AtomicReference<Object> outcome = new AtomicReference<>();
            Thread waiter = new Thread(() -> {
                waiting.countDown();
                try {
                    outcome.set(sub.next(Duration.ofSeconds(30)));
                } catch (Throwable e) {
                    outcome.set(e);
                }
            });
            waiter.start();
            waiting.await();
            Thread.sleep(200);
            long t = System.nanoTime();
            rt.close();
            waiter.join(5000);
            check(!waiter.isAlive(), "the waiter still waits");
            check(outcome.get() instanceof ClosedException, "the waiter saw " + outcome.get());
            check(System.nanoTime() - t < TimeUnit.SECONDS.toNanos(2), "close took too long");
            check(sub.isClosed() && rt.isClosed(), "closed");
            rt.close();
            expect(ClosedException.class, () -> rt.events().lastPosition());
            expect(ClosedException.class, () -> rt.events().subscribe(0));
            expect(ClosedException.class, () -> rt.tools().list());
            expect(ClosedException.class, () -> rt.models().status());
            expect(ClosedException.class, () -> rt.setApprover(r -> Decision.APPROVE));
            expect(ClosedException.class, () -> sub.next(Duration.ZERO));
            Cancellation c = new Cancellation();
            c.close();
            c.close();
            expect(ClosedException.class, c::cancel);
        });

        try (Runtime rt = config("tools").build()) {
            Path files = dir.resolve("tools/files");
            Files.writeString(files.resolve("data.txt"), "hello from java\n");
            AtomicInteger asked = new AtomicInteger();
            List<ApprovalRequest> seen = new ArrayList<>();

            test("tools list every tool with its tier and schema", () -> {
                List<ToolInfo> tools = rt.tools().list();
                ToolInfo read = tools.stream().filter(t -> t.name().equals("file_read")).findFirst().orElseThrow();
                check(read.enabled() && read.tier() == 1 && read.operations().contains("read"), "file_read " + read);
                check(!read.parameters().isEmpty(), "schema");
                check(tools.stream().anyMatch(t -> t.name().equals("file_edit") && !t.enabled()), "file_edit disabled");
            });

            test("a T1 read runs without asking and returns its data", () -> {
                rt.setApprover(r -> {
                    asked.incrementAndGet();
                    return Decision.DENY;
                });
                ToolResult r = rt.tools().execute(ToolRequest.of("s1", "file_read", params("operation", "read", "path", "data.txt")));
                check(r.success() && r.output().contains("hello from java"), "read " + r);
                check(Boolean.TRUE.equals(r.data().get("utf8")), "data " + r.data());
                check(asked.get() == 0, "asked for a T1 tool");
                ToolResult esc = rt.tools().execute(ToolRequest.of("s1", "file_read", params("operation", "read", "path", "../../../etc/passwd")));
                check(!esc.success() && "escape".equals(esc.kind()), "escape kind " + esc.kind());
            });

            test("a given invocation id is the run's", () -> {
                ToolResult r = rt.tools().execute(ToolRequest.of("s1", "file_read", params("operation", "exists", "path", "data.txt"))
                        .withInvocationId("java-inv-1"));
                check(r.success() && "java-inv-1".equals(r.invocationId()) && Boolean.TRUE.equals(r.data().get("exists")), "result " + r);
                check(rt.events().readStream("session-s1", 1, 100).stream()
                        .anyMatch(e -> e.summary().contains("java-inv-1")), "recorded under its id");
            });

            test("an approver sees the request and its decision holds", () -> {
                rt.setApprover(r -> {
                    seen.add(r);
                    return r.parameters().get("path").toString().contains("yes") ? Decision.APPROVE : Decision.DENY;
                });
                ToolResult ok = rt.tools().execute(ToolRequest.of("s2", "file_write", params("operation", "write", "path", "yes.txt", "content", "written")));
                check(ok.success(), "approved write " + ok);
                check(Files.readString(files.resolve("yes.txt")).equals("written"), "the file");
                ToolResult no = rt.tools().execute(ToolRequest.of("s2", "file_write", params("operation", "write", "path", "no.txt", "content", "x")));
                check(!no.success() && "not_allowed".equals(no.kind()) && !Files.exists(files.resolve("no.txt")), "denied " + no);
                ApprovalRequest r = seen.get(0);
                check(r.toolName().equals("file_write") && r.tier() == 2 && r.sessionId().equals("s2"), "request " + r);
                check(r.paths().size() == 1 && r.paths().get(0).endsWith("yes.txt") && r.argv() == null, "paths " + r.paths());
                check(r.notice() == null, "a notice on a plain request: " + r.notice());
                List<Event> events = rt.events().readStream("session-s2", 1, 100);
                check(events.stream().anyMatch(e -> e.typeId().equals("tool.approval_decided")), "decisions recorded");
                check(events.stream().anyMatch(e -> e.typeId().equals("tool.execution_rejected")), "rejection recorded");
            });

            test("an approver that throws denies the run and the error is kept", () -> {
                rt.setApprover(r -> {
                    throw new IllegalStateException("approver bug");
                });
                ToolResult r = rt.tools().execute(ToolRequest.of("s3", "file_write", params("operation", "write", "path", "boom.txt", "content", "x")));
                check(!r.success() && "not_allowed".equals(r.kind()), "denied " + r);
                check(!Files.exists(files.resolve("boom.txt")), "nothing written");
                check(rt.lastCallbackError() instanceof IllegalStateException, "kept " + rt.lastCallbackError());
                rt.setApprover(r2 -> null);
                check(!rt.tools().execute(ToolRequest.of("s3", "file_write", params("operation", "write", "path", "n.txt", "content", "x"))).success(), "null denies");
            });

            test("approve for session covers the session's later runs of the tool", () -> {
                AtomicInteger n = new AtomicInteger();
                rt.setApprover(r -> {
                    n.incrementAndGet();
                    return Decision.APPROVE_FOR_SESSION;
                });
                // The first answer covers every later argv it prefixes.
                for (List<String> argv : List.of(List.of("echo", "hi"), List.of("echo", "hi", "there"), List.of("echo", "hi", "again"))) {
                    check(rt.tools().execute(ToolRequest.of("s4", "shell", params("argv", argv))).success(), "echo");
                }
                check(rt.tools().execute(ToolRequest.of("s4", "shell", params("argv", List.of("echo", "bye")))).success(), "echo bye");
                check(n.get() == 2, "a new prefix asks again: " + n.get());
                check(rt.tools().execute(ToolRequest.of("s5", "shell", params("argv", List.of("echo", "hi")))).success(), "other session");
                check(n.get() == 3, "another session asks again");
            });

            test("a deferred run is pending, decided through approvals(), and runs once after", () -> {
                AtomicInteger deferred = new AtomicInteger();
                rt.setApprover(r -> {
                    deferred.incrementAndGet();
                    return Decision.DEFER;
                });
                Session s = rt.session("java-defer");
                Map<String, Object> p = params("operation", "write", "path", "deferred.txt", "content", "d");
                String message = null;
                try {
                    s.execute("w", "file_write", p, null);
                } catch (PendingException e) {
                    message = e.getMessage();
                }
                check(message != null, "the step waits for a decision");
                String listed = rt.approvals().listJson("java-defer", false);
                Map<String, Object> first = Json.parseObject(listed);
                @SuppressWarnings("unchecked")
                List<Object> requests = (List<Object>) first.get("requests");
                check(requests.size() == 1, "one request " + listed);
                @SuppressWarnings("unchecked")
                String id = (String) ((Map<String, Object>) requests.get(0)).get("request_id");
                check(message.contains(id), "the exception names the request: " + message);
                try {
                    rt.approvals().decideJson("java-defer", "no-such", true, false, "alice", null);
                    check(false, "an unknown request is refused");
                } catch (NotFoundException expected) {
                }
                String decided = rt.approvals().decideJson("java-defer", id, true, false, "alice", null);
                check(decided.contains("\"identity\":\"alice\""), decided);
                try {
                    rt.approvals().decideJson("java-defer", id, false, false, "bob", "no");
                    check(false, "a second decision is refused");
                } catch (ConflictException e) {
                    check(e.getMessage().contains("alice"), "it names the first: " + e.getMessage());
                }
                SessionStep<ToolResult> done = s.execute("w", "file_write", p, null, 1000, null);
                check(done.value().success(), "ran after the decision " + done.value());
                check(deferred.get() == 1, "the approver was asked once: " + deferred.get());
                check(s.execute("w", "file_write", p, null).replayed(), "replayed after");
            });

            test("a cancellation stops a running shell from another thread", () -> {
                rt.setApprover(r -> Decision.APPROVE);
                try (Cancellation c = new Cancellation()) {
                    Thread canceller = cancelSoon(c);
                    long t = System.nanoTime();
                    ToolResult r = rt.tools().execute(ToolRequest.of("s6", "shell", params("argv", List.of("sleep", "30"))), c);
                    canceller.join();
                    check(!r.success() && "cancelled".equals(r.kind()), "cancelled " + r);
                    check(System.nanoTime() - t < TimeUnit.SECONDS.toNanos(10), "it waited for the sleep");
                    c.reset();
                    ToolResult again = rt.tools().execute(ToolRequest.of("s6", "shell", params("argv", List.of("echo", "after"))), c);
                    check(again.success() && again.data().get("stdout").toString().contains("after"), "reused " + again);
                }
            });

            test("an MCP server's tool is listed, validated and called like a built-in", () -> {
                Map<String, String> env = mcpEnv();
                if (env == null) {
                    if ("true".equals(System.getenv("CI"))) throw new AssertionError("the MCP servers are not installed; run scripts/install-mcp.sh");
                    System.out.println("      !!! SKIPPING: MCP servers not installed; run scripts/install-mcp.sh !!!");
                    return;
                }
                Path venv = Path.of(env.get("mcp_time")).getParent().getParent();
                Map<String, Object> isolation = new HashMap<>();
                isolation.put("read_paths", List.of(venv.toString(), env.get("mcp_python_home")));
                if (isRoot()) isolation.put("run_as", "host");
                Map<String, Object> server = Map.of("command", List.of(env.get("mcp_time")), "tier", 1, "isolation", isolation);
                try (Runtime mrt = config("mcp").set("mcp_servers", Map.of("time", server)).build()) {
                    mrt.setApprover(r -> Decision.APPROVE);
                    check(mrt.tools().list().stream().anyMatch(t -> t.name().equals("time.get_current_time") && t.enabled()), "listed");
                    ToolResult r = mrt.tools().execute(ToolRequest.of("m", "time.get_current_time", params("timezone", "UTC")));
                    check(r.success() && r.output().contains("UTC"), "called " + r);
                    ToolResult bad = mrt.tools().execute(ToolRequest.of("m", "time.get_current_time", params("timezone", 5)));
                    check(!bad.success() && "invalid_request".equals(bad.kind()), "validated " + bad);
                }
            });

            test("an MCP server's sampling and elicitation requests are answered by the host", () -> {
                Map<String, String> env = mcpEnv();
                if (env == null) {
                    if ("true".equals(System.getenv("CI"))) throw new AssertionError("the MCP servers are not installed; run scripts/install-mcp.sh");
                    System.out.println("      !!! SKIPPING: MCP servers not installed; run scripts/install-mcp.sh !!!");
                    return;
                }
                // .../node_modules/@modelcontextprotocol/server-everything/dist/index.js -> node_modules
                Path modules = Path.of(env.get("mcp_everything")).getParent().getParent().getParent().getParent();
                Map<String, Object> isolation = new HashMap<>();
                isolation.put("read_paths", List.of(modules.toString()));
                if (isRoot()) isolation.put("run_as", "host");
                Map<String, Object> server = Map.of("command", List.of(env.get("node"), env.get("mcp_everything"), "stdio"),
                        "tier", 1, "isolation", isolation, "startup_timeout_ms", 60000);
                try (Runtime mrt = config("mcp-host").set("mcp_servers", Map.of("ev", server)).build()) {
                    mrt.setApprover(r -> Decision.APPROVE);
                    List<McpRequest> mcpAsked = java.util.Collections.synchronizedList(new ArrayList<>());
                    expect(IllegalArgumentException.class, () -> mrt.setMcpHandler(Set.of(), r -> null));
                    mrt.setMcpHandler(Set.of(McpMethod.SAMPLING, McpMethod.ELICITATION), r -> {
                        mcpAsked.add(r);
                        check(!r.isCancelled(), "wanted while mcpAsked");
                        if (r.method() == McpMethod.SAMPLING) {
                            return "{\"role\": \"assistant\", \"content\": {\"type\": \"text\", \"text\": \"grain, said Java\"}, \"model\": \"jvm-host\"}";
                        }
                        return "{\"action\": \"decline\"}";
                    });
                    check(mrt.tools().list().stream().anyMatch(t -> t.name().equals("ev.trigger-sampling-request") && t.enabled()), "listed");
                    ToolResult r = mrt.tools().execute(ToolRequest.of("m", "ev.trigger-sampling-request", params("prompt", "which ship?", "maxTokens", 10)));
                    check(r.success() && r.output().contains("grain, said Java") && r.output().contains("jvm-host"), "sampled " + r);
                    check(mcpAsked.size() == 1 && mcpAsked.get(0).server().equals("ev") && mcpAsked.get(0).method() == McpMethod.SAMPLING
                            && mcpAsked.get(0).params().get("maxTokens").toString().startsWith("10")
                            && mcpAsked.get(0).isCancelled(), "mcpAsked " + mcpAsked);
                    ToolResult e = mrt.tools().execute(ToolRequest.of("m", "ev.trigger-elicitation-request", params()));
                    check(e.success() && e.output().contains("declined"), "elicited " + e);
                    // An answer that is not an object declines, and is kept as the callback error.
                    mrt.setMcpHandler(Set.of(McpMethod.SAMPLING, McpMethod.ELICITATION), q -> "[1]");
                    ToolResult bad = mrt.tools().execute(ToolRequest.of("m", "ev.trigger-sampling-request", params("prompt", "x", "maxTokens", 5)));
                    check(!bad.success(), "declined " + bad);
                    check(mrt.lastCallbackError() instanceof InvalidArgumentException, "kept " + mrt.lastCallbackError());
                }
            });

            test("a background job is read by cursor, waited for, stopped, and ends with its session", () -> {
                rt.setApprover(r -> Decision.APPROVE);
                ToolResult r = rt.tools().execute(ToolRequest.of("s7", "shell", params("argv", List.of("sleep", "30"), "background", true)));
                check(r.success(), "started " + r);
                String job = r.data().get("job_id").toString();
                List<JobInfo> listed = rt.jobs().list("s7");
                check(listed.size() == 1 && listed.get(0).jobId().equals(job) && listed.get(0).status().running(), "listed " + listed);
                JobOutput none = rt.jobs().read("s7", job, 0, 0, 1024);
                check(none.stdout().isEmpty() && none.status().running(), "read " + none);
                expect(InvalidArgumentException.class, () -> rt.jobs().read("another-session", job, 0, 0, 1024));
                expect(InvalidArgumentException.class, () -> rt.jobs().signal("s7", job, "SEGV"));
                expect(InvalidArgumentException.class, () -> rt.jobs().list(null));
                JobStatus stopped = rt.jobs().stop("s7", job);
                check(!stopped.running() && "stopped".equals(stopped.reason()), "stopped " + stopped);

                ToolResult e = rt.tools().execute(ToolRequest.of("s7", "shell", params("argv", List.of("echo", "hello"), "background", true)));
                String echo = e.data().get("job_id").toString();
                JobStatus done = rt.jobs().await("s7", echo, 10_000, null);
                check("exited".equals(done.reason()) && Integer.valueOf(0).equals(done.exitCode()), "exited " + done);
                JobOutput out = rt.jobs().read("s7", echo, 0, 0, 1024);
                check("hello\n".equals(out.stdout()) && out.stdoutCursor() == 6, "output " + out);
                JobOutput after = rt.jobs().read("s7", echo, out.stdoutCursor(), out.stderrCursor(), 1024);
                check(after.stdout().isEmpty(), "nothing after the cursor " + after);

                rt.tools().execute(ToolRequest.of("s8", "shell", params("argv", List.of("sleep", "30"), "background", true)));
                rt.jobs().endSession("s8");
                check(rt.jobs().list("s8").isEmpty(), "a session's end ends its jobs");
                check(rt.events().readStream("session-s8", 1, 10).stream().anyMatch(ev -> ev.typeId().equals("job.exited")
                        && ev.payloadJson().contains("session_ended")), "recorded");
            });
        }

        try (Runtime rt = config("models").build()) {
            Models models = rt.models();
            List<String> logged = new ArrayList<>();
            Runtime.setLogger((level, message) -> {
                synchronized (logged) {
                    logged.add(level + " [" + Thread.currentThread().getName() + "] " + message);
                }
            }, LogLevel.DEBUG);
            ModelDescriptor gemma = ModelDescriptor.builder("gemma")
                    .residency(Residency.PERSISTENT)
                    .contextSize(2048)
                    .extraArgs("--no-jinja", "--chat-template", "gemma")
                    .build();
            InferenceRequest capital = InferenceRequest.builder()
                    .entry("user", "What is the capital of Italy?")
                    .entry("model", "Rome.")
                    .entry("user", "What is the capital of France?")
                    .temperature(0)
                    .seed(7)
                    .maxTokens(2)
                    .session("chat-1")
                    .build();

            test("an unknown model is an UnknownModelException", () -> {
                expect(UnknownModelException.class, () -> models.infer("never-loaded", capital));
            });

            test("a cancelled load throws and leaves nothing loaded", () -> {
                try (Cancellation c = new Cancellation()) {
                    c.cancel();
                    expect(CancelledException.class, () -> models.load(gemma, c));
                }
                check(models.status().isEmpty(), "status " + models.status());
            });

            test("load, status, current, health, count and tokenize", () -> {
                models.load(gemma);
                List<ModelStatus> st = models.status();
                check(st.size() == 1 && st.get(0).modelId().equals("gemma") && st.get(0).state().equals("loaded"), "status " + st);
                check(st.get(0).pid() != null && st.get(0).port() != null && st.get(0).port() > 0, "pid, port");
                check(models.current().equals(Optional.of("gemma")), "current " + models.current());
                check(models.unhealthy().isEmpty(), "healthy");
                long n = models.countTokens("The capital of France is Paris.");
                check(n > 3 && n < 20, "count " + n);
                check(models.tokenize("Paris").length >= 1, "tokens");
            });

            test("a session step asks the model once and is answered from the log after", () -> {
                Session s = rt.session("java-steps");
                SessionStep<InferenceResult> first = s.infer("t1", "gemma", capital);
                SessionStep<InferenceResult> again = rt.session("java-steps").infer("t1", "gemma", capital);
                check(!first.replayed() && again.replayed(), "replayed " + first + " / " + again);
                check(first.value().text().equals(again.value().text()), "the same answer");
                InferenceRequest other = InferenceRequest.builder().task("Something else.").maxTokens(2).build();
                expect(ConflictException.class, () -> s.infer("t1", "gemma", other));
                expect(InvalidArgumentException.class, () -> s.infer("", "gemma", capital));
                expect(InvalidArgumentException.class, () -> s.infer(null, "gemma", capital));
                String transcript = s.transcriptJson();
                check(transcript.contains("\"source\":\"model\"") && transcript.contains("capital of France"), "transcript " + transcript);
                long claims = rt.events().readStream("session-java-steps", 1, 100).stream()
                        .filter(e -> e.typeId().equals("session.step_started")).count();
                check(claims == 1, "one try recorded, not " + claims);
                StringBuilder pieces = new StringBuilder();
                SessionStep<InferenceResult> streamed = s.stream("t2", "gemma", capital, c -> {
                    pieces.append(c.text());
                    return true;
                }, null);
                check(!streamed.replayed() && pieces.toString().equals(streamed.value().text()), "streamed " + pieces);
                StringBuilder again2 = new StringBuilder();
                SessionStep<InferenceResult> replayed = s.stream("t2", "gemma", capital, c -> {
                    again2.append(c.text());
                    return true;
                }, null);
                check(replayed.replayed() && again2.toString().equals(streamed.value().text()), "replayed whole " + again2);
                expect(CancelledException.class, () -> s.stream("t3", "gemma", capital, c -> false, null));
                check(!s.stream("t3", "gemma", capital, c -> true, null).replayed(), "a stopped try runs again");
            });

            test("infer answers and streams the same text piece by piece", () -> {
                InferenceResult whole = models.infer("gemma", capital);
                check(whole.text() != null && !whole.text().isBlank() && whole.completionTokens() >= 1, "answer " + whole);
                check(whole.model().equals("gemma") && whole.promptTokens() > 5, "usage");
                StringBuilder pieces = new StringBuilder();
                AtomicInteger count = new AtomicInteger();
                InferenceResult streamed = models.stream("gemma", capital, c -> {
                    check(c.kind() == Chunk.Kind.TEXT, "text chunks");
                    pieces.append(c.text());
                    count.incrementAndGet();
                    return true;
                });
                check(pieces.toString().equals(streamed.text()), "pieces " + pieces + " vs " + streamed.text());
                check(streamed.text().equals(whole.text()), "same answer at temperature 0");
                check(count.get() >= 1, "pieces");
            });

            test("embeddings come back in input order, the same for the same text", () -> {
                ModelDescriptor embedder = ModelDescriptor.builder("embedder")
                        .residency(Residency.PERSISTENT)
                        .contextSize(1024)
                        .serves("embeddings")
                        .build();
                models.load(embedder);
                Embeddings e = models.embed("embedder", List.of("the sea", "a cat"));
                check(e.model().equals("embedder") && e.vectors().length == 2, "vectors " + e);
                check(e.vectors()[0].length > 16 && e.vectors()[0].length == e.vectors()[1].length, "dimensions");
                check(!java.util.Arrays.equals(e.vectors()[0], e.vectors()[1]), "two texts, two vectors");
                check(e.promptTokens() > 0, "tokens");
                float[] one = models.embed("embedder", List.of("a cat")).vectors()[0];
                check(java.util.Arrays.equals(one, models.embed("embedder", List.of("a cat")).vectors()[0]), "same text, same vector");
                expect(InvalidArgumentException.class, () -> models.embed("embedder", List.of()));
                expect(InvalidArgumentException.class, () -> models.embed("embedder", List.of("")));
                expect(InvalidArgumentException.class, () -> models.embed("embedder", null));
                expect(InvalidArgumentException.class, () -> models.embed("gemma", List.of("x")));
                expect(UnknownModelException.class, () -> models.embed("never-loaded", List.of("x")));
                models.unload("embedder");
            });

            InferenceRequest story = InferenceRequest.builder().task("Write a long story about the sea.").temperature(0).seed(7).maxTokens(400).build();

            test("a listener that returns false or throws stops the stream", () -> {
                AtomicInteger n = new AtomicInteger();
                expect(CancelledException.class, () -> models.stream("gemma", story, c -> n.incrementAndGet() < 3));
                check(n.get() == 3, "stopped after 3 pieces, not " + n.get());
                CancelledException e = expect(CancelledException.class, () -> models.stream("gemma", story, c -> {
                    throw new IllegalArgumentException("listener bug");
                }));
                check(e.getCause() instanceof IllegalArgumentException, "cause " + e.getCause());
                check(models.infer("gemma", capital).text() != null, "the model still answers");
            });

            test("a cancellation stops an inference from another thread", () -> {
                try (Cancellation c = new Cancellation()) {
                    Thread canceller = cancelSoon(c);
                    expect(CancelledException.class, () -> models.infer("gemma", story, c));
                    canceller.join();
                }
            });

            test("a remote model answers through the loaded server; a dynamic one unloads when idle", () -> {
                long port = models.status().get(0).port();
                models.load(ModelDescriptor.builder("far").endpoints("http://127.0.0.1:" + port).build());
                check(models.status().stream().anyMatch(m -> m.modelId().equals("far") && m.pid() == null), "remote " + models.status());
                check(!models.infer("far", capital).text().isBlank(), "the remote model answers");
                models.unload("far");
                models.load(ModelDescriptor.builder("brief").residency(Residency.DYNAMIC).idleTimeout(Duration.ofMillis(300))
                        .contextSize(1024).threads(2).extraArgs("--no-jinja", "--chat-template", "gemma").build());
                check(models.status().stream().anyMatch(m -> m.modelId().equals("brief") && "dynamic".equals(m.residency())), "dynamic " + models.status());
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
                while (!models.status().isEmpty() && System.nanoTime() < deadline) Thread.sleep(50);
                check(models.status().isEmpty(), "still loaded after its idle timeout: " + models.status());
                List<Event> ev = rt.events().readStream("model-manager", 1, 1000);
                check(ev.stream().anyMatch(e -> e.typeId().equals("model.unloaded") && "idle".equals(((Map<?, ?>) e.payload()).get("reason"))),
                        "an idle unload is recorded");
            });

            test("unload stops the server and the log says so", () -> {
                models.unload("gemma");
                check(models.status().isEmpty(), "status after unload");
                List<Event> ev = rt.events().readStream("model-manager", 1, 1000);
                check(ev.stream().anyMatch(e -> e.typeId().equals("model.loaded")), "loaded event");
                check(ev.get(ev.size() - 1).typeId().equals("model.unloaded"), "unloaded last");
                check(ev.stream().filter(e -> e.typeId().equals("inference.completed")).count() >= 2, "inferences recorded");
                models.unload("gemma");
            });

            test("log records reach a Java listener, from correx's threads too", () -> {
                Runtime.setLogger(null, LogLevel.INFO);
                synchronized (logged) {
                    check(!logged.isEmpty(), "no log record arrived");
                    System.out.println("      " + logged.size() + " records, e.g. " + logged.get(0));
                    System.out.println("      threads: " + logged.stream().map(l -> l.substring(l.indexOf("[") + 1, l.indexOf("]"))).distinct().toList());
                    check(logged.stream().anyMatch(l -> l.contains("[correx-native]")),
                            "no record from a thread correx started");
                }
            });
        }
    }

    static String utf8(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }
}
