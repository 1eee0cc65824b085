//! How a run is confined: the settings ([`IsolationOptions`]), the policy the kernel here can
//! enforce for them (planned once per tool, layer by layer), what each run gets from it, and
//! the run's network by name ([`net`]: the allowlist and the per-run proxy).
//!
//! Tools and services start confined programs through this module; they do not know how the
//! confinement is made.

pub mod applied;
mod filesystem;
mod identity;
mod kernel;
mod limits;
pub(crate) mod net;
mod network;
mod options;
mod policy;
pub(crate) mod view;

pub use applied::AppliedPolicy;
pub use net::{Allowlist, NetworkPolicy};
pub(crate) use network::{Route, RunNetwork};
pub use options::{IsolationMode, IsolationOptions, ResourceLimits, RunAs};
pub(crate) use policy::{plan, Policy};
