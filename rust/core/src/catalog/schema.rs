//! The output schema: the requested columns, checked across shards, and each shard's projection.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use sha2::{Digest, Sha256};

use super::Shard;
use crate::error::{Error, Result};

pub(crate) fn schema_digest(schema: &Schema) -> [u8; 16] {
    let d = Sha256::digest(format!("{:?}", schema.fields()).as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Check the shards agree on the requested columns and compute each shard's projection.
/// Returns the output schema (requested order; a column is nullable if it is in any shard).
pub(super) fn project(shards: &mut [Shard], columns: Option<&[String]>) -> Result<SchemaRef> {
    let Some(first) = shards.first() else {
        return Ok(Arc::new(Schema::empty()));
    };
    let first_schema = first.schema.clone();
    let first_path = first.path.display().to_string();
    let names: Vec<String> = match columns {
        Some(cols) => {
            let mut seen = BTreeSet::new();
            for c in cols {
                if !seen.insert(c) {
                    return Err(Error::Schema(format!("column {c:?} requested twice")));
                }
            }
            cols.to_vec()
        }
        None => first_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
    };
    let mut fields: Vec<Field> = Vec::with_capacity(names.len());
    for name in &names {
        let f = first_schema.field_with_name(name).map_err(|_| {
            Error::Schema(format!(
                "unknown column {name:?}: {first_path} has columns {:?}",
                first_schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            ))
        })?;
        if let Some(bad) = nul_name(f) {
            return Err(Error::Schema(format!(
                "column {bad:?} in {first_path} has a NUL byte in its name: Arrow's C data \
                 interface (how batches reach Python) cannot carry it; rename the column or \
                 leave it out with columns=[...]"
            )));
        }
        fields.push(f.as_ref().clone().with_metadata(Default::default()));
    }
    for shard in shards.iter_mut() {
        let schema = shard.schema.clone();
        let path = shard.path.display().to_string();
        if columns.is_none() {
            if let Some(extra) = schema.fields().iter().find(|f| !names.contains(f.name())) {
                return Err(Error::Schema(format!(
                    "incompatible shards: column {:?} is in {path} but not in {first_path} \
                     (pass columns=[...] to read only the shared columns)",
                    extra.name()
                )));
            }
        }
        let mut roots = Vec::with_capacity(names.len());
        for (name, field) in names.iter().zip(fields.iter_mut()) {
            let (idx, f) = schema.column_with_name(name).ok_or_else(|| {
                Error::Schema(format!(
                    "incompatible shards: column {name:?} is in {first_path} but missing from {path}"
                ))
            })?;
            if !same_type(f.data_type(), field.data_type()) {
                return Err(Error::Schema(format!(
                    "incompatible shards: column {name:?} is {} in {first_path} but {} in {path}",
                    field.data_type(),
                    f.data_type()
                )));
            }
            if f.is_nullable() && !field.is_nullable() {
                *field = field.clone().with_nullable(true);
            }
            roots.push(idx);
        }
        let mut sorted = roots.clone();
        sorted.sort_unstable();
        shard.reorder = roots
            .iter()
            .map(|r| sorted.binary_search(r).expect("root is in the sorted list"))
            .collect();
        shard.roots = sorted;
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The first field name (this one or nested) containing a NUL byte.
fn nul_name(f: &Field) -> Option<String> {
    if f.name().contains('\0') {
        return Some(f.name().clone());
    }
    let children: Vec<&Field> = match f.data_type() {
        DataType::List(c)
        | DataType::LargeList(c)
        | DataType::ListView(c)
        | DataType::LargeListView(c)
        | DataType::FixedSizeList(c, _)
        | DataType::Map(c, _) => vec![c.as_ref()],
        DataType::Struct(fs) => fs.iter().map(|c| c.as_ref()).collect(),
        DataType::Union(fs, _) => fs.iter().map(|(_, c)| c.as_ref()).collect(),
        DataType::Dictionary(_, v) => {
            return nul_name(&Field::new("v", v.as_ref().clone(), true));
        }
        DataType::RunEndEncoded(a, b) => vec![a.as_ref(), b.as_ref()],
        _ => vec![],
    };
    children.into_iter().find_map(nul_name)
}

/// Types must match exactly (including nested field names): batches from different shards are
/// gathered into one output batch, which needs one schema.
fn same_type(a: &DataType, b: &DataType) -> bool {
    a == b
}
