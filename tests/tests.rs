//! The integration tests, built as one binary.

mod stub;
mod util;

mod events;
mod inference;
mod tools;
