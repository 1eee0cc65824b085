//! Payloads read strictly: serde's derive binds a JSON array to a struct by position (an
//! inference `"config": [0.5, 0.9, 7]` would be temperature, top_p and max_tokens), which no
//! host means. [`from_value`] deserializes a `serde_json::Value` through a deserializer that
//! refuses an array wherever a struct is expected, at every depth.
//!
//! Internally tagged enums buffer their content before the struct inside sees it, past this
//! deserializer: their struct fields use [`object`] instead.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, Unexpected, VariantAccess, Visitor,
};
use serde::Deserialize;
use serde_json::{Error, Map, Value};

/// Deserializes `value` as `T`, refusing an array where `T` (or anything in it) is a struct.
pub(crate) fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    T::deserialize(Strict(value))
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

struct Strict(Value);

impl<'de> Deserializer<'de> for Strict {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => {
                let len = items.len();
                let mut seq = Seq(items.into_iter());
                let out = visitor.visit_seq(&mut seq)?;
                if seq.0.len() == 0 {
                    Ok(out)
                } else {
                    Err(de::Error::invalid_length(len, &"fewer elements"))
                }
            }
            Value::Object(map) => visitor.visit_map(Fields {
                iter: map.into_iter(),
                value: None,
            }),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &"an object")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.into_deserializer()),
            Value::Object(map) if map.len() == 1 => {
                let Some((variant, value)) = map.into_iter().next() else {
                    return Err(de::Error::custom("an empty enum object"));
                };
                visitor.visit_enum(Enum { variant, value })
            }
            other => other.deserialize_enum(name, variants, visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct Seq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Seq {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Fields {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(k.into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked for before its key"))?;
        seed.deserialize(Strict(v))
    }
}

struct Enum {
    variant: String,
    value: Value,
}

impl<'de> EnumAccess<'de> for Enum {
    type Error = Error;
    type Variant = Variant;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Variant), Error> {
        let v = seed.deserialize(self.variant.into_deserializer())?;
        Ok((v, Variant(self.value)))
    }
}

struct Variant(Value);

impl<'de> VariantAccess<'de> for Variant {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(
                unexpected(&other),
                &"a unit variant",
            )),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(Strict(self.0))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        Strict(self.0).deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        Strict(self.0).deserialize_struct("", fields, visitor)
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
