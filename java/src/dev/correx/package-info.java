/**
 * correx for JVM hosts, JDK 17 and newer: {@link dev.correx.Runtime} opens the event log, the
 * model manager and the sandboxed tools; {@link dev.correx.EventLog}, {@link dev.correx.Models}
 * and {@link dev.correx.Tools} reach them; {@link dev.correx.Approver} decides risky tool runs.
 * Every failure is a {@link dev.correx.CorrexException} subclass carrying the C ABI's code and
 * message. The native part is JNI glue over correx's C ABI, shipped inside the jar.
 */
package dev.correx;
