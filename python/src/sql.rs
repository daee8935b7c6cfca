//! The application's SQL on either backend: statements with `?`
//! placeholders, their parameters and rows as [`SqlValue`]s.
//!
//! Invariant: SQL runs only inside a transaction ordo opened (a producer's
//! write, an apply) or on a read-only connection; nothing here begins or
//! ends a transaction.

use ordo::core::{ErrorKind, StoreError};
use ordo::postgres::PgTx;
use ordo::sqlite::rusqlite::{self, types::Value as LiteValue, types::ValueRef, Connection};
use postgres::types::{IsNull, ToSql, Type};

use crate::convert::SqlValue;

/// Why a statement failed: the store (a lock, the disk, the connection),
/// or the statement itself (its syntax, a constraint, its parameters).
#[derive(Debug)]
pub enum SqlFail {
    /// The store failed.
    Store(StoreError),
    /// The statement was refused; the transaction can go on.
    Statement(String),
}

impl From<StoreError> for SqlFail {
    fn from(e: StoreError) -> SqlFail {
        SqlFail::Store(e)
    }
}

/// What runs the application's SQL: an SQLite connection or a PostgreSQL
/// transaction.
pub trait TxSql {
    /// Runs one statement; the rows it changed.
    fn exec(&self, sql: &str, params: &[SqlValue]) -> Result<u64, SqlFail>;
    /// Runs one query; its rows.
    fn rows(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, SqlFail>;
}

fn lite_param(value: &SqlValue) -> LiteValue {
    match value {
        SqlValue::Null => LiteValue::Null,
        SqlValue::Bool(b) => LiteValue::Integer(i64::from(*b)),
        SqlValue::Integer(i) => LiteValue::Integer(*i),
        SqlValue::Real(x) => LiteValue::Real(*x),
        SqlValue::Text(s) => LiteValue::Text(s.clone()),
        SqlValue::Blob(b) => LiteValue::Blob(b.clone()),
        SqlValue::Json(v) => LiteValue::Text(v.to_string()),
    }
}

fn lite_value(value: ValueRef<'_>) -> SqlValue {
    match value {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Integer(i),
        ValueRef::Real(x) => SqlValue::Real(x),
        ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
    }
}

/// An SQLite error: the store's (busy, I/O, full, corrupt, read only) or
/// the statement's.
fn lite_fail(e: rusqlite::Error) -> SqlFail {
    use rusqlite::ErrorCode as C;
    let kind = match e.sqlite_error_code() {
        Some(C::DatabaseBusy) | Some(C::DatabaseLocked) => ErrorKind::Busy,
        Some(C::DiskFull) => ErrorKind::DiskFull,
        Some(C::ReadOnly) => ErrorKind::ReadOnly,
        Some(C::DatabaseCorrupt) | Some(C::NotADatabase) => ErrorKind::Corrupt,
        Some(C::SystemIoFailure) | Some(C::CannotOpen) => ErrorKind::Other,
        _ => return SqlFail::Statement(format!("SQLite: {e}")),
    };
    SqlFail::Store(StoreError::new(kind, format!("SQLite: {e}")))
}

impl TxSql for Connection {
    fn exec(&self, sql: &str, params: &[SqlValue]) -> Result<u64, SqlFail> {
        let mut statement = self.prepare_cached(sql).map_err(lite_fail)?;
        let params = rusqlite::params_from_iter(params.iter().map(lite_param));
        if statement.column_count() == 0 {
            let changed = statement.execute(params).map_err(lite_fail)?;
            return Ok(changed as u64);
        }
        // A statement with rows (`INSERT ... RETURNING`): run to the end.
        let mut rows = statement.query(params).map_err(lite_fail)?;
        while rows.next().map_err(lite_fail)?.is_some() {}
        drop(rows);
        Ok(self.changes())
    }

    fn rows(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, SqlFail> {
        let mut statement = self.prepare_cached(sql).map_err(lite_fail)?;
        let columns = statement.column_count();
        let params = rusqlite::params_from_iter(params.iter().map(lite_param));
        let mut rows = statement.query(params).map_err(lite_fail)?;
        let mut all = Vec::new();
        while let Some(row) = rows.next().map_err(lite_fail)? {
            let values = (0..columns)
                .map(|i| row.get_ref(i).map(lite_value))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(lite_fail)?;
            all.push(values);
        }
        Ok(all)
    }
}

/// `?` placeholders as PostgreSQL's `$1`, `$2`, ..., outside quoted text,
/// quoted identifiers, dollar-quoted strings and comments. (`?` as a
/// `jsonb` operator cannot be written: use `jsonb_exists` and its kin.)
pub fn numbered_placeholders(sql: &str) -> String {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len() + 8);
    let (mut i, mut n) = (0usize, 0u32);
    while i < chars.len() {
        let c = chars[i];
        let rest = &chars[i..];
        let skip = match c {
            '\'' | '"' => closing(rest, 1, &[c]),
            '-' if rest.get(1) == Some(&'-') => closing(rest, 2, &['\n']),
            '/' if rest.get(1) == Some(&'*') => closing(rest, 2, &['*', '/']),
            '$' => dollar_quote(rest),
            _ => 0,
        };
        if skip > 0 {
            out.extend(&chars[i..i + skip]);
            i += skip;
            continue;
        }
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// The length of a quoted span starting at `rest[0]`: up to and with the
/// first `end` after `from` (the rest of the text when unclosed). A
/// doubled quote closes and opens again, which comes to the same.
fn closing(rest: &[char], from: usize, end: &[char]) -> usize {
    let mut j = from;
    while j + end.len() <= rest.len() {
        if &rest[j..j + end.len()] == end {
            return j + end.len();
        }
        j += 1;
    }
    rest.len()
}

/// The length of a dollar-quoted string (`$tag$ ... $tag$`) starting at
/// `rest[0]`, or 0 when `$` starts none (`$1`).
fn dollar_quote(rest: &[char]) -> usize {
    let mut j = 1;
    while j < rest.len() && (rest[j].is_alphanumeric() || rest[j] == '_') {
        if j == 1 && rest[j].is_ascii_digit() {
            return 0;
        }
        j += 1;
    }
    if rest.get(j) != Some(&'$') {
        return 0;
    }
    let tag = &rest[..=j];
    closing(rest, j + 1, tag)
}

/// A parameter converted to the type PostgreSQL declared for it.
#[derive(Debug)]
struct PgParam<'a>(&'a SqlValue);

fn mismatch(value: &SqlValue, ty: &Type) -> Box<dyn std::error::Error + Sync + Send> {
    format!("cannot pass {value:?} as a parameter of type {ty}").into()
}

impl ToSql for PgParam<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let text = matches!(
            *ty,
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
        );
        match self.0 {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Bool(b) if *ty == Type::BOOL => b.to_sql(ty, out),
            SqlValue::Integer(i) => match *ty {
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT8 => i.to_sql(ty, out),
                Type::FLOAT4 => (*i as f32).to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::BOOL if *i == 0 || *i == 1 => (*i == 1).to_sql(ty, out),
                Type::JSON | Type::JSONB => serde_json::Value::from(*i).to_sql(ty, out),
                _ if text => i.to_string().to_sql(ty, out),
                _ => Err(mismatch(self.0, ty)),
            },
            SqlValue::Real(x) => match *ty {
                Type::FLOAT4 => (*x as f32).to_sql(ty, out),
                Type::FLOAT8 => x.to_sql(ty, out),
                Type::JSON | Type::JSONB => serde_json::Value::from(*x).to_sql(ty, out),
                _ if text => x.to_string().to_sql(ty, out),
                _ => Err(mismatch(self.0, ty)),
            },
            SqlValue::Text(s) => match *ty {
                Type::JSON | Type::JSONB => {
                    serde_json::from_str::<serde_json::Value>(s)?.to_sql(ty, out)
                }
                _ if text => s.as_str().to_sql(ty, out),
                _ => Err(mismatch(self.0, ty)),
            },
            SqlValue::Blob(b) if *ty == Type::BYTEA => b.as_slice().to_sql(ty, out),
            SqlValue::Json(v) if matches!(*ty, Type::JSON | Type::JSONB) => v.to_sql(ty, out),
            _ => Err(mismatch(self.0, ty)),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A PostgreSQL column's value, by its type.
fn pg_value(row: &postgres::Row, i: usize) -> Result<SqlValue, SqlFail> {
    let ty = row.columns()[i].type_().clone();
    let fail = |e: postgres::Error| SqlFail::Statement(format!("PostgreSQL: column {i}: {e}"));
    let value = match ty {
        Type::BOOL => row.try_get::<_, Option<bool>>(i).map_err(fail)?.map(SqlValue::Bool),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)
            .map_err(fail)?
            .map(|v| SqlValue::Integer(v.into())),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)
            .map_err(fail)?
            .map(|v| SqlValue::Integer(v.into())),
        Type::INT8 => row.try_get::<_, Option<i64>>(i).map_err(fail)?.map(SqlValue::Integer),
        Type::OID => row
            .try_get::<_, Option<u32>>(i)
            .map_err(fail)?
            .map(|v| SqlValue::Integer(v.into())),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)
            .map_err(fail)?
            .map(|v| SqlValue::Real(v.into())),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(i).map_err(fail)?.map(SqlValue::Real),
        Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i).map_err(fail)?.map(SqlValue::Blob),
        Type::JSON | Type::JSONB => row
            .try_get::<_, Option<serde_json::Value>>(i)
            .map_err(fail)?
            .map(SqlValue::Json),
        _ => row.try_get::<_, Option<String>>(i).map_err(|_| {
            SqlFail::Statement(format!(
                "PostgreSQL: column {i} is of type {ty}, which ordo does not convert: cast it (::text, ::bigint) in the query"
            ))
        })?
        .map(SqlValue::Text),
    };
    Ok(value.unwrap_or(SqlValue::Null))
}

impl TxSql for PgTx {
    fn exec(&self, sql: &str, params: &[SqlValue]) -> Result<u64, SqlFail> {
        let params: Vec<PgParam<'_>> = params.iter().map(PgParam).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        Ok(self.execute(&numbered_placeholders(sql), &refs)?)
    }

    fn rows(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, SqlFail> {
        let params: Vec<PgParam<'_>> = params.iter().map(PgParam).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = self.query(&numbered_placeholders(sql), &refs)?;
        rows.iter()
            .map(|row| (0..row.len()).map(|i| pg_value(row, i)).collect())
            .collect()
    }
}
