//! Chapter 6.3: a request body read as one JSON object whose fields are read one at a time.
//! Reading field by field (rather than deriving one struct) is what lets every error name its
//! field: serde's own messages for a whole struct give a line and a column, which a client
//! cannot act on.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::errors::ApiError;

/// A request body that parsed as a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonBody(Map<String, Value>);

impl JsonBody {
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(other) => Err(ApiError::bad_request(format!(
                "the body must be a JSON object, not {}",
                kind_of(&other)
            ))),
            Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
        }
    }

    /// A field's value; absent and `null` are both `None`.
    pub fn raw(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A field as a typed value; absent and `null` are `None`, a wrong type is a 400 naming it.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.raw(name)
            .map(|v| T::deserialize(v).map_err(|e| ApiError::invalid(name, format!("{name}: {e}"))))
            .transpose()
    }
}

/// How a JSON value is called in messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let body = JsonBody::parse(br#"{"temperature": "hot", "top_k": null, "n": 1}"#).unwrap();
        let err = body.get::<f32>("temperature").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("temperature"));
        assert!(err.message.starts_with("temperature: invalid type: string"));
        assert_eq!(body.get::<i32>("top_k").unwrap(), None);
        assert_eq!(body.get::<u32>("n").unwrap(), Some(1));
        assert_eq!(body.get::<u32>("absent").unwrap(), None);
    }

    #[test]
    fn only_objects_are_bodies() {
        let err = JsonBody::parse(b"[1, 2]").unwrap_err();
        assert_eq!(err.message, "the body must be a JSON object, not a list");
        let err = JsonBody::parse(b"{\"prompt\": ").unwrap_err();
        assert!(err.message.starts_with("malformed JSON body: "), "{err:?}");
        assert_eq!(err.param, None);
    }
}
