//! `nanoserve serve` over real HTTP on loopback, with the embedded model: the OpenAI
//! endpoints streamed and not, the chunk endpoints, every kind of bad input, clients that
//! leave mid-stream, a bounded load test, graceful shutdown, and the official `openai` Python
//! client.

mod access_log;
mod api;
mod choices;
mod chunks;
mod disconnect;
mod errors;
mod harness;
mod load;
mod max_model_len;
mod misuse;
mod openai_python;
mod shutdown;
mod soak;
mod timeouts;
