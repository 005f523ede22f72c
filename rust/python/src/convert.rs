//! Python objects <-> the core's state tree (`serde_json::Value`), and Arrow batches out
//! ([`BatchOut`]).
//!
//! Only shapes are converted here: what a state's fields must be is the core's business
//! (`shardstream_core::state::envelope`). What cannot be a state value at all — bytes, objects,
//! NaN, ints beyond 64 bits, dict keys that are not strings, nesting deeper than any state — is a
//! `StateError` naming where it is (`state['position']['buffer']`).

use std::sync::{Arc, Mutex};

use arrow_array::ffi::FFI_ArrowArray;
use arrow_array::{Array, RecordBatch, StructArray};
use arrow_schema::SchemaRef;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3_arrow::PySchema;
use serde_json::{Map, Number, Value};

use crate::error::state_error;

/// Deeper than any state shardstream writes (5 levels today), shallow enough to never recurse
/// into trouble on a hostile checkpoint.
const MAX_DEPTH: usize = 32;

/// `obj` (a state or part of one) as a value tree; `what` names it in errors.
pub fn to_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    let mut path = what.to_string();
    convert(obj, &mut path, 0)
}

fn convert(obj: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> PyResult<Value> {
    let py = obj.py();
    if depth > MAX_DEPTH {
        return Err(state_error(
            py,
            format!("{path} is nested deeper than {MAX_DEPTH} levels: not a shardstream state"),
        ));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(Value::Number(v.into()));
        }
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(Value::Number(v.into()));
        }
        return Err(state_error(
            py,
            format!("{path} must be an int in [-2**63, 2**64), got {obj}"),
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| {
                state_error(py, format!("{path} is {obj}, not a number a state holds"))
            });
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    let items = |it: pyo3::Bound<'_, pyo3::types::PyIterator>, path: &mut String| {
        let mut out = Vec::new();
        for (i, item) in it.enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            out.push(convert(&item?, path, depth + 1)?);
            path.truncate(len);
        }
        Ok::<_, PyErr>(Value::Array(out))
    };
    if let Ok(l) = obj.cast::<PyList>() {
        return items(l.try_iter()?, path);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return items(t.try_iter()?, path);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(key) = k.extract::<String>() else {
                return Err(state_error(
                    py,
                    format!("{path} has a key that is not a str: {k}"),
                ));
            };
            let len = path.len();
            path.push_str(&format!("['{key}']"));
            let v = convert(&v, path, depth + 1)?;
            path.truncate(len);
            map.insert(key, v);
        }
        return Ok(Value::Object(map));
    }
    Err(state_error(
        py,
        format!(
            "{path} is a {}: a state holds only None, bools, ints, strings, lists and dicts",
            obj.get_type().name()?
        ),
    ))
}

/// Row ids as a shuffle buffer's text in a state (`shardstream_core::state::ids_to_latin1`), made
/// from their little-endian bytes by CPython's Latin-1 decoder: one scan and a copy, where the
/// core's `String` would be UTF-8 (two bytes for half the characters) and decoded as such.
pub fn ids_to_py<'py>(py: Python<'py>, ids: &[u64]) -> PyResult<Bound<'py, PyString>> {
    #[cfg(target_endian = "little")]
    // SAFETY: on a little-endian target a `u64`'s memory is its little-endian bytes; `u8` has
    // alignment 1 and every bit pattern, and the slice covers exactly the ids' memory.
    let raw: &[u8] = unsafe { std::slice::from_raw_parts(ids.as_ptr().cast(), ids.len() * 8) };
    #[cfg(not(target_endian = "little"))]
    let raw: &[u8] = &ids
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect::<Vec<u8>>();
    let len = pyo3::ffi::Py_ssize_t::try_from(raw.len())
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("shuffle buffer too large"))?;
    // SAFETY: `raw` is valid for `len` bytes during the call; a NULL `errors` is "strict", which
    // Latin-1 never needs (every byte is a character). The result is a new reference or NULL
    // with an exception set, which `from_owned_ptr_or_err` turns into the error.
    unsafe {
        let s = pyo3::ffi::PyUnicode_DecodeLatin1(raw.as_ptr().cast(), len, std::ptr::null());
        Ok(Bound::from_owned_ptr_or_err(py, s)?.cast_into_unchecked())
    }
}

/// A value tree as plain Python objects (dicts keep the fields' order).
pub fn from_value<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let l = PyList::empty(py);
            for it in items {
                l.append(from_value(py, it)?)?;
            }
            l.into_any()
        }
        Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, from_value(py, v)?)?;
            }
            d.into_any()
        }
    })
}

/// Every item of a Python list as a value tree (each a state: `state[...]` in errors).
pub fn list_to_values(items: &Bound<'_, PyList>) -> PyResult<Vec<Value>> {
    items.iter().map(|it| to_value(&it, "state")).collect()
}

/// How many schemas a [`BatchOut`] keeps imported (a mixture's parts have one per source).
const SCHEMAS_KEPT: usize = 8;

static IMPORT_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Hands record batches to pyarrow without copying their data, importing each schema into
/// pyarrow once: a batch crosses the C data interface as a struct array only, imported against
/// the `pyarrow.Schema` kept here (pyo3-arrow's `into_pyarrow` exports and re-imports the
/// schema with every batch, which cost more than the batch itself). One per stream (or reader),
/// so a schema that changes between batches is imported again, never mismatched.
#[derive(Default)]
pub struct BatchOut {
    schemas: Mutex<Vec<(SchemaRef, Py<PyAny>)>>,
}

impl BatchOut {
    /// `batch` as a `pyarrow.RecordBatch` (same buffers, same schema incl. metadata).
    pub fn to_pyarrow<'py>(
        &self,
        py: Python<'py>,
        batch: RecordBatch,
    ) -> PyResult<Bound<'py, PyAny>> {
        let schema = self.schema(py, batch.schema_ref())?;
        let data = StructArray::from(batch).into_data();
        // Boxed so the struct pyarrow moves out of stays put; what pyarrow did not take (an
        // error before the move) is released by its drop.
        let mut array = Box::new(FFI_ArrowArray::new(&data));
        drop(data);
        let import = IMPORT_BATCH.get_or_try_init(py, || {
            py.import("pyarrow")?
                .getattr("RecordBatch")?
                .getattr("_import_from_c")
                .map(Bound::unbind)
        })?;
        let ptr = &mut *array as *mut FFI_ArrowArray as usize;
        import.bind(py).call1((ptr, schema))
    }

    /// The `pyarrow.Schema` of `schema`, imported on first sight. The lock is never held across
    /// a call into Python (pyarrow releases the GIL while importing).
    fn schema(&self, py: Python<'_>, schema: &SchemaRef) -> PyResult<Py<PyAny>> {
        {
            let mut kept = self.schemas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = kept.iter().position(|(s, _)| Arc::ptr_eq(s, schema)) {
                return Ok(kept[i].1.clone_ref(py));
            }
            // An equal schema in another allocation (fields, types, metadata all compared).
            if let Some(i) = kept.iter().position(|(s, _)| s == schema) {
                kept[i].0 = schema.clone();
                return Ok(kept[i].1.clone_ref(py));
            }
        }
        let imported = PySchema::new(schema.clone()).into_pyarrow(py)?.unbind();
        let mut kept = self.schemas.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= SCHEMAS_KEPT {
            kept.remove(0);
        }
        kept.push((schema.clone(), imported.clone_ref(py)));
        Ok(imported)
    }
}
