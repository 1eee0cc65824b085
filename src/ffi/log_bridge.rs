//! Forwards the `log` facade's records to a host callback.

use parking_lot::RwLock;
use std::ffi::{c_char, c_void, CString};

/// A log callback: `level` is 1 (error) to 5 (trace); `message` lives only during the call.
/// It may be called from any thread, including correx's own background threads.
pub type correx_log_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, level: i32, message: *const c_char)>;

struct Sink {
    callback: unsafe extern "C" fn(*mut c_void, i32, *const c_char),
    user_data: *mut c_void,
    max_level: log::LevelFilter,
}

// SAFETY: the host promises, by registering it, that the callback and its user_data may be
// used from any thread (documented on correx_set_log_callback).
unsafe impl Send for Sink {}
// SAFETY: as above; correx never mutates user_data, it only passes it back.
unsafe impl Sync for Sink {}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

struct Bridge;

impl log::Log for Bridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        SINK.read()
            .as_ref()
            .is_some_and(|s| metadata.level() <= s.max_level)
    }

    fn log(&self, record: &log::Record<'_>) {
        let sink = SINK.read_recursive();
        let Some(s) = sink.as_ref() else { return };
        if record.level() > s.max_level {
            return;
        }
        let text = format!("{}: {}", record.target(), record.args()).replace('\0', "\\0");
        let Ok(msg) = CString::new(text) else { return };
        // SAFETY: the host registered this callback for exactly this call shape; msg is a live
        // NUL-terminated string for the duration of the call.
        unsafe { (s.callback)(s.user_data, record.level() as i32, msg.as_ptr()) };
    }

    fn flush(&self) {}
}

/// Sets (or, with a NULL callback, clears) the process-wide log callback. Records at or below
/// `max_level` (1 error, 2 warn, 3 info, 4 debug, 5 trace) are passed to it.
///
/// # Parameters
/// - `callback`: called with `user_data`, the level and a message that lives only during the
///   call; may be called from any thread, concurrently.
/// - `user_data`: passed back untouched; correx never frees it.
/// - `max_level`: the most verbose level delivered; out-of-range values are clamped.
///
/// # Returns
/// `CORREX_OK`, or `CORREX_E_INVALID_ARGUMENT` when another logger (from a Rust host) owns the
/// `log` facade.
///
/// # Blocking and threads
/// Never blocks for long; callable from any thread. The callback may run while correx holds
/// internal locks: it must return promptly and must not call any correx function.
///
/// # Safety
/// `callback` is NULL or a function safe to call from any thread with `user_data`.
#[no_mangle]
pub unsafe extern "C" fn correx_set_log_callback(
    callback: correx_log_callback,
    user_data: *mut c_void,
    max_level: i32,
) -> i32 {
    let level = match max_level {
        i32::MIN..=0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Error,
        2 => log::LevelFilter::Warn,
        3 => log::LevelFilter::Info,
        4 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    };
    static BRIDGE: Bridge = Bridge;
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    static OURS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    INSTALLED.call_once(|| {
        OURS.store(
            log::set_logger(&BRIDGE).is_ok(),
            std::sync::atomic::Ordering::SeqCst,
        );
    });
    if !OURS.load(std::sync::atomic::Ordering::SeqCst) {
        return super::CORREX_E_INVALID_ARGUMENT;
    }
    *SINK.write() = callback.map(|callback| Sink {
        callback,
        user_data,
        max_level: level,
    });
    log::set_max_level(if callback.is_some() {
        level
    } else {
        log::LevelFilter::Off
    });
    super::CORREX_OK
}
