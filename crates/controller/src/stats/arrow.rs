//! Arrow IPC streams ⇄ the stats store's columns: `WriteRows` batches are decoded into
//! [`ColumnData`], `Query` results encoded as one record batch. Types map one to one with the
//! published `ColumnType`s; timestamps of any unit are stored as milliseconds, maps and lists as
//! JSON text.

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, ListBuilder,
    MapBuilder, MapFieldNames, StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float64Type, Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use iris_store::stats::{ColumnData, ColumnKind, QueryResult, Value};
use std::sync::Arc;

/// Decodes an IPC stream into columns (every batch in it, appended in order).
pub(crate) fn decode(ipc: &[u8]) -> Result<Vec<ColumnData>, String> {
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)
        .map_err(|e| format!("arrow_ipc is not an Arrow IPC stream: {e}"))?;
    let schema = reader.schema();
    let mut columns: Vec<ColumnData> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        columns.push(ColumnData {
            name: field.name().clone(),
            kind: kind_of(field.name(), field.data_type())?,
            values: Vec::new(),
        });
    }
    for batch in reader {
        let batch = batch.map_err(|e| format!("arrow_ipc holds an unreadable batch: {e}"))?;
        for (column, array) in columns.iter_mut().zip(batch.columns()) {
            append_values(&column.name, array.as_ref(), &mut column.values)?;
        }
    }
    Ok(columns)
}

fn kind_of(name: &str, dt: &DataType) -> Result<ColumnKind, String> {
    Ok(match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnKind::String,
        DataType::Int64 => ColumnKind::Int64,
        DataType::Int32 => ColumnKind::Int32,
        DataType::Float64 => ColumnKind::Float64,
        DataType::Boolean => ColumnKind::Bool,
        DataType::Timestamp(_, _) => ColumnKind::TimestampMs,
        DataType::Binary | DataType::LargeBinary => ColumnKind::Bytes,
        DataType::Map(_, _) => ColumnKind::Map,
        DataType::List(f) if f.data_type() == &DataType::Float64 => ColumnKind::Float64List,
        DataType::List(f) if f.data_type() == &DataType::Int64 => ColumnKind::Int64List,
        other => {
            return Err(format!(
                "column \"{name}\": Arrow type {other} is not a stats column type (use string, int64, int32, float64, bool, timestamp, binary, map<string,string>, list<float64> or list<int64>)"
            ))
        }
    })
}

fn append_values(name: &str, array: &dyn Array, out: &mut Vec<Value>) -> Result<(), String> {
    let n = array.len();
    out.reserve(n);
    macro_rules! each {
        ($a:expr, $f:expr) => {{
            let a = $a;
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Value::Null
                } else {
                    $f(a.value(i))
                });
            }
        }};
    }
    match array.data_type() {
        DataType::Utf8 => each!(array.as_string::<i32>(), |v: &str| Value::Text(v.into())),
        DataType::LargeUtf8 => each!(array.as_string::<i64>(), |v: &str| Value::Text(v.into())),
        DataType::Utf8View => each!(array.as_string_view(), |v: &str| Value::Text(v.into())),
        DataType::Int64 => each!(array.as_primitive::<Int64Type>(), Value::Int),
        DataType::Int32 => each!(array.as_primitive::<Int32Type>(), |v: i32| Value::Int(
            v.into()
        )),
        DataType::Float64 => each!(array.as_primitive::<Float64Type>(), Value::Real),
        DataType::Boolean => each!(array.as_boolean(), |v: bool| Value::Int(i64::from(v))),
        DataType::Timestamp(TimeUnit::Second, _) => {
            each!(array.as_primitive::<TimestampSecondType>(), |v: i64| {
                Value::Int(v.saturating_mul(1000))
            })
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            each!(array.as_primitive::<TimestampMillisecondType>(), Value::Int)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            each!(
                array.as_primitive::<TimestampMicrosecondType>(),
                |v: i64| { Value::Int(v.div_euclid(1000)) }
            )
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            each!(array.as_primitive::<TimestampNanosecondType>(), |v: i64| {
                Value::Int(v.div_euclid(1_000_000))
            })
        }
        DataType::Binary => each!(array.as_binary::<i32>(), |v: &[u8]| Value::Blob(v.to_vec())),
        DataType::LargeBinary => {
            each!(array.as_binary::<i64>(), |v: &[u8]| Value::Blob(v.to_vec()))
        }
        DataType::Map(_, _) => {
            let map = array.as_map();
            for i in 0..n {
                if map.is_null(i) {
                    out.push(Value::Null);
                    continue;
                }
                let entries = map.value(i);
                let (keys, values) = (entries.column(0), entries.column(1));
                let (Some(keys), Some(values)) =
                    (keys.as_string_opt::<i32>(), values.as_string_opt::<i32>())
                else {
                    return Err(format!(
                        "column \"{name}\": a MAP column must be map<string, string>"
                    ));
                };
                let mut obj = serde_json::Map::new();
                for j in 0..keys.len() {
                    let v = if values.is_null(j) {
                        serde_json::Value::Null
                    } else {
                        values.value(j).into()
                    };
                    obj.insert(keys.value(j).to_string(), v);
                }
                out.push(Value::Text(serde_json::Value::Object(obj).to_string()));
            }
        }
        DataType::List(f) => {
            let list = array.as_list::<i32>();
            for i in 0..n {
                if list.is_null(i) {
                    out.push(Value::Null);
                    continue;
                }
                let item = list.value(i);
                let json: Vec<serde_json::Value> = match f.data_type() {
                    DataType::Float64 => {
                        let a = item.as_primitive::<Float64Type>();
                        (0..a.len())
                            .map(|j| {
                                if a.is_null(j) {
                                    serde_json::Value::Null
                                } else {
                                    a.value(j).into()
                                }
                            })
                            .collect()
                    }
                    _ => {
                        let a = item.as_primitive::<Int64Type>();
                        (0..a.len())
                            .map(|j| {
                                if a.is_null(j) {
                                    serde_json::Value::Null
                                } else {
                                    a.value(j).into()
                                }
                            })
                            .collect()
                    }
                };
                out.push(Value::Text(serde_json::Value::Array(json).to_string()));
            }
        }
        other => {
            return Err(format!(
                "column \"{name}\": Arrow type {other} is not a stats column type"
            ))
        }
    }
    Ok(())
}

/// Encodes a query result as an IPC stream of one batch (its schema first).
pub(crate) fn encode(result: &QueryResult) -> Result<Vec<u8>, String> {
    let mut fields = Vec::with_capacity(result.columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(result.columns.len());
    for (column, values) in result.columns.iter().zip(&result.values) {
        let array = build(column.kind, values);
        fields.push(Field::new(&column.name, array.data_type().clone(), true));
        arrays.push(array);
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| format!("building the result batch: {e}"))?;
    let mut out = Vec::new();
    {
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema)
            .map_err(|e| format!("encoding the result: {e}"))?;
        writer
            .write(&batch)
            .and_then(|()| writer.finish())
            .map_err(|e| format!("encoding the result: {e}"))?;
    }
    Ok(out)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::Text(s) => Some(s),
        _ => None,
    }
}

fn build(kind: ColumnKind, values: &[Value]) -> ArrayRef {
    match kind {
        ColumnKind::String => {
            let mut b = StringBuilder::new();
            values.iter().for_each(|v| b.append_option(text(v)));
            Arc::new(b.finish())
        }
        ColumnKind::Int64 => {
            let mut b = Int64Builder::new();
            values.iter().for_each(|v| b.append_option(int(v)));
            Arc::new(b.finish())
        }
        ColumnKind::Int32 => {
            let mut b = Int32Builder::new();
            values
                .iter()
                .for_each(|v| b.append_option(int(v).and_then(|i| i32::try_from(i).ok())));
            Arc::new(b.finish())
        }
        ColumnKind::Float64 => {
            let mut b = Float64Builder::new();
            values.iter().for_each(|v| {
                b.append_option(match v {
                    Value::Real(f) => Some(*f),
                    _ => None,
                })
            });
            Arc::new(b.finish())
        }
        ColumnKind::Bool => {
            let mut b = BooleanBuilder::new();
            values
                .iter()
                .for_each(|v| b.append_option(int(v).map(|i| i != 0)));
            Arc::new(b.finish())
        }
        ColumnKind::TimestampMs => {
            let mut b = TimestampMillisecondBuilder::new();
            values.iter().for_each(|v| b.append_option(int(v)));
            Arc::new(b.finish())
        }
        ColumnKind::Bytes => {
            let mut b = BinaryBuilder::new();
            values.iter().for_each(|v| {
                b.append_option(match v {
                    Value::Blob(x) => Some(x.as_slice()),
                    _ => None,
                })
            });
            Arc::new(b.finish())
        }
        ColumnKind::Map => {
            let names = MapFieldNames {
                entry: "entries".into(),
                key: "key".into(),
                value: "value".into(),
            };
            let mut b = MapBuilder::new(Some(names), StringBuilder::new(), StringBuilder::new());
            for v in values {
                let parsed = text(v).and_then(|t| {
                    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t).ok()
                });
                match parsed {
                    Some(obj) => {
                        for (k, val) in obj {
                            b.keys().append_value(k);
                            match val {
                                serde_json::Value::String(s) => b.values().append_value(s),
                                serde_json::Value::Null => b.values().append_null(),
                                other => b.values().append_value(other.to_string()),
                            }
                        }
                        // The key and value builders always hold the same count here.
                        let _ = b.append(true);
                    }
                    None => {
                        let _ = b.append(false);
                    }
                }
            }
            Arc::new(b.finish())
        }
        ColumnKind::Float64List => list(Float64Builder::new(), values),
        ColumnKind::Int64List => list(Int64Builder::new(), values),
    }
}

/// A list column from JSON arrays (a value that is not one is a null list).
fn list<B, T>(items: B, values: &[Value]) -> ArrayRef
where
    B: arrow_array::builder::ArrayBuilder + Extend<Option<T>>,
    T: serde::de::DeserializeOwned,
{
    let mut b = ListBuilder::new(items);
    for v in values {
        match text(v).and_then(|t| serde_json::from_str::<Vec<Option<T>>>(t).ok()) {
            Some(items) => {
                b.values().extend(items);
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}
