//! HTTP as correx speaks it to servers it does not run in-process: llama-server and other
//! OpenAI-compatible engines, remote MCP servers.

mod client;

pub(crate) use client::{Endpoint, HttpClient, HttpError, Request, Resolver, Response};
