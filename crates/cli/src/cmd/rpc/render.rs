//! A reply as pretty proto3 JSON (the proto's own snake_case field names, as the published CLI
//! prints them; 64-bit integers as strings, enums by name, default values left out), with the keys of each message in field-number order and the keys
//! of each map sorted, so the same reply always prints the same text.

use anyhow::Context as _;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage as _, SerializeOptions,
};
use serde_json::Value;
use std::fmt::Write as _;

pub(crate) fn to_pretty_json(reply: &DynamicMessage) -> anyhow::Result<String> {
    let value = reply
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().use_proto_field_name(true),
        )
        .context("rendering the reply as JSON")?;
    let mut out = String::new();
    write(&mut out, &value, Some(&reply.descriptor()), 0)?;
    Ok(out)
}

/// Writes `v`; `message` is the message type of `v` when it is a message object.
fn write(
    out: &mut String,
    v: &Value,
    message: Option<&MessageDescriptor>,
    depth: usize,
) -> anyhow::Result<()> {
    match v {
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<(&String, Option<FieldDescriptor>)> = map
                .keys()
                .map(|k| (k, message.and_then(|m| field_by_json_name(m, k))))
                .collect();
            // Fields by number (as the published CLI prints them); keys the descriptor does not know (map keys) sorted,
            // which the map already is.
            keys.sort_by_key(|(_, f)| f.as_ref().map(|f| f.number()).unwrap_or(u32::MAX));
            out.push_str("{\n");
            for (i, (key, field)) in keys.iter().enumerate() {
                indent(out, depth + 1);
                write!(out, "{}: ", serde_json::to_string(key)?)?;
                let item = &map[key.as_str()];
                match field {
                    Some(f) if f.is_map() => write_map(out, item, f, depth + 1)?,
                    Some(f) => write_items(out, item, element_type(f).as_ref(), depth + 1)?,
                    None => write(out, item, None, depth + 1)?,
                }
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            indent(out, depth);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => write_items(out, v, message, depth)?,
        scalar => out.push_str(&serde_json::to_string(scalar)?),
    }
    Ok(())
}

/// A field's value: each element of a list, or the value itself, as `element`.
fn write_items(
    out: &mut String,
    v: &Value,
    element: Option<&MessageDescriptor>,
    depth: usize,
) -> anyhow::Result<()> {
    let Value::Array(items) = v else {
        return write(out, v, element, depth);
    };
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push_str("[\n");
    for (i, item) in items.iter().enumerate() {
        indent(out, depth + 1);
        write(out, item, element, depth + 1)?;
        out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
    }
    indent(out, depth);
    out.push(']');
    Ok(())
}

/// A map field: sorted keys (the JSON object already is), values of the entry's value type.
fn write_map(
    out: &mut String,
    v: &Value,
    field: &FieldDescriptor,
    depth: usize,
) -> anyhow::Result<()> {
    let value_type = match field.kind() {
        Kind::Message(entry) => match entry.map_entry_value_field().kind() {
            Kind::Message(m) => Some(m),
            _ => None,
        },
        _ => None,
    };
    let Value::Object(map) = v else {
        return write(out, v, None, depth);
    };
    if map.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    out.push_str("{\n");
    for (i, (key, item)) in map.iter().enumerate() {
        indent(out, depth + 1);
        write!(out, "{}: ", serde_json::to_string(key)?)?;
        write(out, item, value_type.as_ref(), depth + 1)?;
        out.push_str(if i + 1 < map.len() { ",\n" } else { "\n" });
    }
    indent(out, depth);
    out.push('}');
    Ok(())
}

fn element_type(field: &FieldDescriptor) -> Option<MessageDescriptor> {
    match field.kind() {
        Kind::Message(m) => Some(m),
        _ => None,
    }
}

fn field_by_json_name(m: &MessageDescriptor, key: &str) -> Option<FieldDescriptor> {
    m.get_field_by_json_name(key)
        .or_else(|| m.get_field_by_name(key))
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::rpc::pool;

    #[test]
    fn fields_print_by_number_and_map_keys_sorted() {
        let desc = pool()
            .get_message_by_name("iris.cluster.Controller.LaunchJobRequest")
            .expect("message");
        let body = serde_json::json!({
            "replicas": 2,
            "name": "/u/a",
            "environment": {"envVars": {"Z": "1", "A": "2", "M": "3"}},
            "constraints": [{"op": "CONSTRAINT_OP_EXISTS", "key": "pool"}],
            "entrypoint": {"runCommand": {"argv": ["true"]}},
        });
        let msg = DynamicMessage::deserialize(desc, body.clone()).expect("valid");
        let text = to_pretty_json(&msg).expect("renders");
        let back: Value = serde_json::from_str(&text).expect("JSON");
        let mut want = body.clone();
        want["environment"] = serde_json::json!({"env_vars": {"Z": "1", "A": "2", "M": "3"}});
        want["entrypoint"] = serde_json::json!({"run_command": {"argv": ["true"]}});
        assert_eq!(
            back, want,
            "the proto's field names, as the published CLI prints"
        );
        let pos = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
        assert!(
            pos("\"name\"") < pos("\"entrypoint\"") && pos("\"entrypoint\"") < pos("\"replicas\"")
        );
        assert!(pos("\"A\"") < pos("\"M\"") && pos("\"M\"") < pos("\"Z\""));
        assert!(pos("\"key\"") < pos("\"op\""), "{text}");
        assert!(text.starts_with("{\n  \"name\": \"/u/a\",\n"), "{text}");
        for _ in 0..5 {
            assert_eq!(to_pretty_json(&msg).expect("renders"), text);
        }
    }
}
