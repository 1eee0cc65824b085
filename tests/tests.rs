//! The integration tests, built as one binary.

mod streaming;
mod stub;
mod tools_util;
mod util;

mod approvals;
mod bundles;
mod cli;
mod confined;
mod docs;
mod embeddings;
mod events;
mod evidence;
mod ffi;
mod header;
mod inference;
mod install;
mod jobs;
mod manager;
mod mcp;
mod mcp_remote;
mod network;
mod observe;
mod openai;
mod postgres;
mod prompt_cache;
mod sandbox;
mod scheduler;
mod server_confined;
mod serving_truth;
mod sessions;
mod staged;
mod tools;
mod upgrade;
mod view;
