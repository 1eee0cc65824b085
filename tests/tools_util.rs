//! /proc helpers shared by tests.

/// How many processes have a command line for which `f` holds.
pub fn count_processes(f: impl Fn(&str) -> bool) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    let cmd = String::from_utf8_lossy(&c).replace('\0', " ");
                    // Zombies have an empty cmdline.
                    !cmd.is_empty() && f(&cmd)
                })
                .unwrap_or(false)
        })
        .count()
}

/// A marker unique to this process and call, made of digits (it can stand as a `sleep`
/// argument), to find a test's processes in /proc.
pub fn marker() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}{:03}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}
