//! Resource limits a child sets on itself before exec.

/// One `setrlimit` a child makes: soft and hard limit both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rlimit {
    pub resource: libc::__rlimit_resource_t,
    pub value: u64,
}

impl Rlimit {
    /// A limit of `value`, lowered to the current hard limit (raising a hard limit needs
    /// privileges a host usually lacks, and a lower hard limit is already stricter).
    pub fn at_most(resource: libc::__rlimit_resource_t, value: u64) -> Rlimit {
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: getrlimit writes one rlimit struct that lives on this stack frame.
        let hard = if unsafe { libc::getrlimit(resource, &mut cur) } == 0 {
            cur.rlim_max
        } else {
            libc::RLIM_INFINITY
        };
        Rlimit {
            resource,
            value: value.min(hard),
        }
    }
}
