//! The integration tests, built as one binary.

mod util;

mod events;
mod tools;
