//! The server's input settings that decide how JSONEachRow reads a value.
//!
//! In: the values of [`InputSettings::NAMES`] as the insert would see them
//! (read from `system.settings` with the insert's own settings applied)
//! and the time zone of the session (`SELECT timezone()`). Out: what the
//! encoder must mirror. A value it does not know is an error: the caller
//! then keeps the JSON path.

/// How `date_time_input_format` reads a time from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateTimeInput {
    Basic,
    BestEffort,
}

/// What JSONEachRow does, under the insert's settings, that the binary
/// encoder must do the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSettings {
    pub date_time_input_format: DateTimeInput,
    /// A field the table has no column for is skipped (else refused).
    pub skip_unknown_fields: bool,
    /// A missing field takes the column's DEFAULT expression.
    pub defaults_for_omitted_fields: bool,
    /// JSON `null` in a column that is not Nullable takes its default.
    pub null_as_default: bool,
    /// Floats read exactly (correctly rounded), as Rust reads them.
    pub precise_float_parsing: bool,
    pub read_bools_as_numbers: bool,
    pub read_bools_as_strings: bool,
    pub read_numbers_as_strings: bool,
    pub read_objects_as_strings: bool,
    pub read_arrays_as_strings: bool,
    pub named_tuples_as_objects: bool,
    pub ignore_unknown_keys_in_named_tuple: bool,
    pub defaults_for_missing_elements_in_named_tuple: bool,
    /// A field not read is skipped without parsing (duplicates of it are
    /// not refused).
    pub ignore_unnecessary_fields: bool,
    /// `input_format_import_nested_json`: objects fill `a.b` columns.
    pub import_nested_json: bool,
    /// `input_format_json_empty_as_default`: `""` takes the default.
    pub empty_as_default: bool,
    pub map_as_array_of_tuples: bool,
    /// `input_format_force_null_for_omitted_fields` (absent before 24.x).
    pub force_null_for_omitted_fields: bool,
    /// `input_format_read_datetime_number_as_raw_value` (26.8): a bare
    /// integer into `DateTime64` is ticks (true) or seconds (false);
    /// `None` on a server without the setting, whose behaviour this
    /// encoder does not mirror.
    pub datetime_number_as_raw: Option<bool>,
    /// `input_format_json_max_depth`.
    pub max_depth: u64,
    /// `input_format_json_max_object_size` (0: no limit).
    pub max_object_size: u64,
    /// `format_binary_max_string_size` (0: no limit).
    pub binary_max_string_size: u64,
    /// `format_binary_max_array_size` (0: no limit).
    pub binary_max_array_size: u64,
    /// The session's time zone (`timezone()`): a `DateTime` without one of
    /// its own reads text in it.
    pub timezone: String,
}

impl InputSettings {
    /// The settings read, by their names in `system.settings`.
    pub const NAMES: &'static [&'static str] = &[
        "date_time_input_format",
        "input_format_skip_unknown_fields",
        "input_format_defaults_for_omitted_fields",
        "input_format_null_as_default",
        "precise_float_parsing",
        "input_format_json_read_bools_as_numbers",
        "input_format_json_read_bools_as_strings",
        "input_format_json_read_numbers_as_strings",
        "input_format_json_read_objects_as_strings",
        "input_format_json_read_arrays_as_strings",
        "input_format_json_named_tuples_as_objects",
        "input_format_json_ignore_unknown_keys_in_named_tuple",
        "input_format_json_defaults_for_missing_elements_in_named_tuple",
        "input_format_json_ignore_unnecessary_fields",
        "input_format_import_nested_json",
        "input_format_json_empty_as_default",
        "input_format_json_map_as_array_of_tuples",
        "input_format_force_null_for_omitted_fields",
        "input_format_read_datetime_number_as_raw_value",
        "input_format_json_max_depth",
        "input_format_json_max_object_size",
        "format_binary_max_string_size",
        "format_binary_max_array_size",
    ];

    /// The settings from `value(name)` (for each of [`Self::NAMES`]; `None`
    /// when the server has no such setting) and the session's time zone.
    /// A setting the server must have but lacks, or a value not known
    /// here, is an error.
    pub fn from_values<'v>(
        value: impl Fn(&str) -> Option<&'v str>,
        timezone: &str,
    ) -> Result<InputSettings, String> {
        let flag = |name: &str, absent: Option<bool>| -> Result<bool, String> {
            match value(name).map(str::trim) {
                Some("1" | "true") => Ok(true),
                Some("0" | "false") => Ok(false),
                Some(v) => Err(format!("{name} = {v:?} is not a boolean")),
                None => absent.ok_or_else(|| format!("the server has no setting {name}")),
            }
        };
        let number = |name: &str, absent: u64| -> Result<u64, String> {
            match value(name).map(str::trim) {
                Some(v) => v
                    .parse()
                    .map_err(|_| format!("{name} = {v:?} is not a number")),
                None => Ok(absent),
            }
        };
        let date_time_input_format = match value("date_time_input_format").map(str::trim) {
            Some("basic") => DateTimeInput::Basic,
            Some("best_effort") => DateTimeInput::BestEffort,
            Some(v) => return Err(format!("date_time_input_format = {v:?} is not mirrored")),
            None => return Err("the server has no setting date_time_input_format".into()),
        };
        let datetime_number_as_raw = match value("input_format_read_datetime_number_as_raw_value") {
            None => None,
            Some(_) => Some(flag(
                "input_format_read_datetime_number_as_raw_value",
                None,
            )?),
        };
        Ok(InputSettings {
            date_time_input_format,
            skip_unknown_fields: flag("input_format_skip_unknown_fields", None)?,
            defaults_for_omitted_fields: flag("input_format_defaults_for_omitted_fields", None)?,
            null_as_default: flag("input_format_null_as_default", None)?,
            // Before it existed the fast parser was the only one.
            precise_float_parsing: flag("precise_float_parsing", Some(false))?,
            read_bools_as_numbers: flag("input_format_json_read_bools_as_numbers", Some(false))?,
            read_bools_as_strings: flag("input_format_json_read_bools_as_strings", Some(false))?,
            read_numbers_as_strings: flag(
                "input_format_json_read_numbers_as_strings",
                Some(false),
            )?,
            read_objects_as_strings: flag(
                "input_format_json_read_objects_as_strings",
                Some(false),
            )?,
            read_arrays_as_strings: flag("input_format_json_read_arrays_as_strings", Some(false))?,
            named_tuples_as_objects: flag(
                "input_format_json_named_tuples_as_objects",
                Some(false),
            )?,
            ignore_unknown_keys_in_named_tuple: flag(
                "input_format_json_ignore_unknown_keys_in_named_tuple",
                Some(false),
            )?,
            defaults_for_missing_elements_in_named_tuple: flag(
                "input_format_json_defaults_for_missing_elements_in_named_tuple",
                Some(false),
            )?,
            ignore_unnecessary_fields: flag(
                "input_format_json_ignore_unnecessary_fields",
                Some(false),
            )?,
            // Absent: it did not exist, and neither did what it does; read
            // as "on" where "on" makes the encoder fall back.
            import_nested_json: flag("input_format_import_nested_json", None)?,
            empty_as_default: flag("input_format_json_empty_as_default", Some(false))?,
            map_as_array_of_tuples: flag("input_format_json_map_as_array_of_tuples", Some(false))?,
            force_null_for_omitted_fields: flag(
                "input_format_force_null_for_omitted_fields",
                Some(false),
            )?,
            datetime_number_as_raw,
            max_depth: number("input_format_json_max_depth", 1000)?,
            max_object_size: number("input_format_json_max_object_size", 0)?,
            binary_max_string_size: number("format_binary_max_string_size", 0)?,
            binary_max_array_size: number("format_binary_max_array_size", 0)?,
            timezone: timezone.to_string(),
        })
    }

    /// Why no row can take the binary path under these settings, if so.
    pub(crate) fn unusable(&self) -> Option<&'static str> {
        if !self.defaults_for_omitted_fields {
            return Some("input_format_defaults_for_omitted_fields is off");
        }
        if self.force_null_for_omitted_fields {
            return Some("input_format_force_null_for_omitted_fields is on");
        }
        if self.import_nested_json {
            return Some("input_format_import_nested_json is on");
        }
        if self.max_depth < 2 * super::json::MAX_DEPTH as u64 {
            return Some("input_format_json_max_depth is below the encoder's own limit");
        }
        None
    }

    /// Whether the session's time zone is UTC (zero offset at every instant).
    pub(crate) fn utc(&self, tz: Option<&str>) -> bool {
        is_utc(tz.unwrap_or(&self.timezone))
    }
}

/// Names of time zones that are UTC at every instant.
pub(crate) fn is_utc(tz: &str) -> bool {
    matches!(
        tz,
        "UTC"
            | "Etc/UTC"
            | "GMT"
            | "Etc/GMT"
            | "UCT"
            | "Etc/UCT"
            | "Universal"
            | "Etc/Universal"
            | "Zulu"
            | "Etc/Zulu"
    )
}

/// ClickHouse 26.9's defaults, as `system.settings` lists them, in UTC:
/// for tests and benchmarks that run without a server.
pub fn server_defaults() -> InputSettings {
    let values = [
        ("date_time_input_format", "best_effort"),
        ("input_format_skip_unknown_fields", "1"),
        ("input_format_defaults_for_omitted_fields", "1"),
        ("input_format_null_as_default", "1"),
        ("precise_float_parsing", "1"),
        ("input_format_json_read_bools_as_numbers", "1"),
        ("input_format_json_read_bools_as_strings", "1"),
        ("input_format_json_read_numbers_as_strings", "1"),
        ("input_format_json_read_objects_as_strings", "1"),
        ("input_format_json_read_arrays_as_strings", "1"),
        ("input_format_json_named_tuples_as_objects", "1"),
        ("input_format_json_ignore_unknown_keys_in_named_tuple", "1"),
        (
            "input_format_json_defaults_for_missing_elements_in_named_tuple",
            "1",
        ),
        ("input_format_json_ignore_unnecessary_fields", "1"),
        ("input_format_import_nested_json", "0"),
        ("input_format_json_empty_as_default", "0"),
        ("input_format_json_map_as_array_of_tuples", "0"),
        ("input_format_read_datetime_number_as_raw_value", "0"),
        ("input_format_json_max_depth", "1000"),
        ("input_format_json_max_object_size", "536870912"),
        ("format_binary_max_string_size", "1073741824"),
        ("format_binary_max_array_size", "1073741824"),
    ];
    let get = |n: &str| values.iter().find(|v| v.0 == n).map(|v| v.1);
    InputSettings::from_values(get, "Etc/UTC").expect("known values")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_servers_values() {
        let s = server_defaults();
        assert_eq!(s.date_time_input_format, DateTimeInput::BestEffort);
        assert!(s.skip_unknown_fields && s.precise_float_parsing);
        assert_eq!(s.datetime_number_as_raw, Some(false));
        assert!(!s.force_null_for_omitted_fields);
        assert_eq!(s.unusable(), None);
        assert!(s.utc(None));
        assert!(!s.utc(Some("Asia/Tokyo")));
    }

    #[test]
    fn unknown_values_and_missing_settings_are_errors() {
        let get = |v: &'static str| move |n: &str| (n == "date_time_input_format").then_some(v);
        assert!(InputSettings::from_values(get("best_effort_us"), "UTC").is_err());
        // Only date_time_input_format: the other required ones are missing.
        assert!(InputSettings::from_values(get("basic"), "UTC").is_err());
        let bad = |n: &str| match n {
            "date_time_input_format" => Some("basic"),
            "input_format_skip_unknown_fields" => Some("maybe"),
            _ => Some("1"),
        };
        assert!(InputSettings::from_values(bad, "UTC").is_err());
    }
}
