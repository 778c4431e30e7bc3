//! Chapter 6.3: the OpenAI wire format of `nanoserve serve`, apart from the server that
//! speaks it. A request body is read field by field ([`JsonBody`]) into a checked
//! [`GenerationRequest`] (its defaults, its limits, and a 400 naming the field for anything
//! this server cannot do as asked); failures take OpenAI's error shape ([`ApiError`]); answers
//! and stream chunks are written by [`ResponseShape`]. Nothing here runs a model: the server
//! crate (`phase6-server`) hands the checked request to the engine.

mod api_types;
mod body;
mod errors;
mod limits;
mod logprobs;
pub mod request;

pub use api_types::{
    Admitted, Choice, Endpoint, EngineInfo, Finish, GenerationRequest, PromptInput, ResponseShape,
    Usage,
};
pub use body::{JsonBody, kind_of};
pub use errors::ApiError;
pub use limits::RequestLimits;
pub use logprobs::{ChoiceLogprobs, Entry};
