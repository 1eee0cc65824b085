//! Payloads and config read strictly, with the path of whatever is wrong.
//!
//! serde's derive binds a JSON array to a struct by position (an inference
//! `"config": [0.5, 0.9, 7]` would be temperature, top_p and max_tokens), which no host means.
//! [`from_value`] deserializes a `serde_json::Value` through a deserializer that refuses an
//! array wherever a struct is expected, at every depth, and names where an error is
//! (`config.temperature: invalid type: ...`). [`config_from_value`] reads the same way with
//! the config's two extra rules: `null` is the same as leaving a field out, and no string may
//! hold a NUL byte (each becomes a path, an argument or a variable).
//!
//! Internally tagged enums buffer their content before the struct inside sees it, past this
//! deserializer: their struct fields use [`object`] instead.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, Unexpected, VariantAccess, Visitor,
};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::fmt;

/// What is wrong and where: `path` is empty for the top level, else like `tools.shell.env.A`
/// or `rules[0].action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JsonError {
    pub(crate) path: String,
    pub(crate) reason: String,
}

impl JsonError {
    /// The same error one level down: beneath a key or an index.
    fn under(mut self, segment: Segment<'_>) -> Self {
        let seg = match segment {
            Segment::Key(k) => k.to_owned(),
            Segment::Index(i) => format!("[{i}]"),
        };
        self.path = if self.path.is_empty() {
            seg
        } else if self.path.starts_with('[') {
            format!("{seg}{}", self.path)
        } else {
            format!("{seg}.{}", self.path)
        };
        self
    }
}

enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl std::error::Error for JsonError {}

impl de::Error for JsonError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        JsonError {
            path: String::new(),
            reason: msg.to_string(),
        }
    }

    fn missing_field(field: &'static str) -> Self {
        JsonError {
            path: field.to_owned(),
            reason: "missing".to_owned(),
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        JsonError {
            path: field.to_owned(),
            reason: format!("unknown field; expected one of: {}", expected.join(", ")),
        }
    }
}

/// The two rule sets: a payload's, and a config's (nulls absent, no NUL bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Payload,
    Config,
}

/// Deserializes `value` as `T`, refusing an array where `T` (or anything in it) is a struct.
pub(crate) fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, JsonError> {
    T::deserialize(Strict(value, Mode::Payload))
}

/// As [`from_value`], with the config's rules: a `null` field is absent (its default applies),
/// and a string holding a NUL byte is refused.
pub(crate) fn config_from_value<T: DeserializeOwned>(value: Value) -> Result<T, JsonError> {
    T::deserialize(Strict(value, Mode::Config))
}

/// For a struct-typed field inside an internally tagged enum: an object, read strictly.
pub(crate) fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let map = Map::<String, Value>::deserialize(d)?;
    from_value(Value::Object(map)).map_err(de::Error::custom)
}

/// As [`object`], for an optional field: `null` (or absent, with `#[serde(default)]`) is `None`.
pub(crate) fn optional_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Option::<Map<String, Value>>::deserialize(d)? {
        None => Ok(None),
        Some(map) => from_value(Value::Object(map))
            .map(Some)
            .map_err(de::Error::custom),
    }
}

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (None, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

fn no_nul(s: &str, mode: Mode) -> Result<(), JsonError> {
    match s.find('\0') {
        Some(at) if mode == Mode::Config => Err(de::Error::custom(format!(
            "holds a NUL byte (at byte {at}), which no path, argument or variable can carry"
        ))),
        _ => Ok(()),
    }
}

struct Strict(Value, Mode);

impl<'de> Deserializer<'de> for Strict {
    type Error = JsonError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, JsonError> {
        let mode = self.1;
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => {
                no_nul(&s, mode)?;
                visitor.visit_string(s)
            }
            Value::Array(items) => {
                let len = items.len();
                let mut seq = Seq {
                    iter: items.into_iter(),
                    index: 0,
                    mode,
                };
                let out = visitor.visit_seq(&mut seq)?;
                if seq.iter.len() == 0 {
                    Ok(out)
                } else {
                    Err(de::Error::invalid_length(len, &"fewer elements"))
                }
            }
            Value::Object(map) => visitor.visit_map(Fields {
                iter: map.into_iter(),
                value: None,
                mode,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, JsonError> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, JsonError> {
        match self.0 {
            // A config's `null` field is a field left out (its default applies); any other
            // `null`, such as an unknown key's or a map value's, is read as written.
            Value::Object(mut map) if self.1 == Mode::Config => {
                map.retain(|k, v| !(v.is_null() && fields.contains(&k.as_str())));
                Strict(Value::Object(map), self.1).deserialize_any(visitor)
            }
            Value::Object(map) => Strict(Value::Object(map), self.1).deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &"an object")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, JsonError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, JsonError> {
        let mode = self.1;
        match self.0 {
            Value::String(s) => {
                no_nul(&s, mode)?;
                visitor.visit_enum(s.into_deserializer())
            }
            // A config's enums are plain words.
            Value::Object(map) if map.len() == 1 && mode == Mode::Payload => {
                let Some((variant, value)) = map.into_iter().next() else {
                    return Err(de::Error::custom("an empty enum object"));
                };
                visitor.visit_enum(Enum {
                    variant,
                    value,
                    mode,
                })
            }
            other => Err(de::Error::invalid_type(
                unexpected(&other),
                &"a string or an object with one key",
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct Seq {
    iter: std::vec::IntoIter<Value>,
    index: usize,
    mode: Mode,
}

impl<'de> SeqAccess<'de> for Seq {
    type Error = JsonError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, JsonError> {
        let Some(v) = self.iter.next() else {
            return Ok(None);
        };
        let index = self.index;
        self.index += 1;
        seed.deserialize(Strict(v, self.mode))
            .map(Some)
            .map_err(|e| e.under(Segment::Index(index)))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Fields {
    iter: serde_json::map::IntoIter,
    value: Option<(String, Value)>,
    mode: Mode,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = JsonError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, JsonError> {
        match self.iter.next() {
            Some((k, v)) => {
                let key = seed
                    .deserialize(Strict(Value::String(k.clone()), self.mode))
                    .map_err(|e| {
                        // An unknown field names itself; anything else names the key.
                        if e.path.is_empty() {
                            e.under(Segment::Key(&k))
                        } else {
                            e
                        }
                    })?;
                self.value = Some((k, v));
                Ok(Some(key))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, JsonError> {
        let (k, v) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked for before its key"))?;
        seed.deserialize(Strict(v, self.mode))
            .map_err(|e| e.under(Segment::Key(&k)))
    }
}

struct Enum {
    variant: String,
    value: Value,
    mode: Mode,
}

impl<'de> EnumAccess<'de> for Enum {
    type Error = JsonError;
    type Variant = Variant;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Variant), JsonError> {
        let v = seed.deserialize(self.variant.as_str().into_deserializer())?;
        Ok((v, Variant(self.value, self.mode)))
    }
}

struct Variant(Value, Mode);

impl<'de> VariantAccess<'de> for Variant {
    type Error = JsonError;

    fn unit_variant(self) -> Result<(), JsonError> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(
                unexpected(&other),
                &"a unit variant",
            )),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, JsonError> {
        seed.deserialize(Strict(self.0, self.1))
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, JsonError> {
        Strict(self.0, self.1).deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, JsonError> {
        Strict(self.0, self.1).deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::{GenerationConfig, InferenceRequest};
    use serde_json::json;

    #[test]
    fn an_array_never_binds_to_a_struct() {
        let ok: InferenceRequest = from_value(json!({
            "context": {"task": "hi"},
            "config": {"temperature": 0.5, "max_tokens": 7}
        }))
        .expect("an object binds");
        assert_eq!(ok.config.max_tokens, 7);
        // What serde's derive alone accepts, by position.
        let loose: Result<GenerationConfig, _> = serde_json::from_value(json!([0.5, 0.9, 7]));
        assert!(
            loose.is_ok(),
            "serde_json binds arrays to structs; this test would not tell"
        );
        let e = from_value::<InferenceRequest>(json!({
            "context": {"task": "hi"},
            "config": [0.5, 0.9, 7]
        }))
        .expect_err("an array for config");
        assert!(e.to_string().contains("expected an object"), "{e}");
        assert!(from_value::<InferenceRequest>(json!([{"task": "hi"}, {}])).is_err());
        // Inside an internally tagged enum too.
        let e = from_value::<InferenceRequest>(json!({
            "context": {"task": "hi"},
            "config": {"response_format": {"type": "json_schema", "json_schema": ["n", {}, true]}}
        }))
        .expect_err("an array inside a tagged enum");
        assert!(e.to_string().contains("map"), "{e}");
        // The tagged enum itself as an array: the tag, then the fields by position.
        for format in [
            json!(["json_schema", {"schema": {}}]),
            json!(["json_object", {}]),
        ] {
            let e = from_value::<InferenceRequest>(json!({
                "context": {"task": "hi"},
                "config": {"response_format": format}
            }))
            .expect_err("an array for response_format");
            assert!(e.to_string().contains("map"), "{e}");
        }
        let ok: InferenceRequest = from_value(json!({
            "context": {"task": "hi"},
            "config": {"response_format": {"type": "json_object"}}
        }))
        .expect("an object binds");
        assert!(ok.config.response_format.is_some());
        let none: InferenceRequest = from_value(json!({
            "context": {"task": "hi"},
            "config": {"response_format": null}
        }))
        .expect("null is none");
        assert!(none.config.response_format.is_none());
    }
}
