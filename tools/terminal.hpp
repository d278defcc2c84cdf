#pragma once
// Terminal manners of the `multidev` command: s-expressions indented for a
// reader, and the closest valid name to a mistyped one.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <multidev/sexp.hpp>

namespace multidev::tools {

/// `x` printed for a reader: a list that fits in `width` columns at its
/// indentation stays on one line, and so does a nested record (a list of
/// atoms and lists of atoms, such as one device's `(device (ordinal 0) (kind
/// cpu) ...)`) however long; any other list puts its head on the first line
/// and each further item on a line of its own, indented two more columns.
/// The result is the same s-expression: `parse_sexp` reads it back to `x`.
/// No trailing newline.
std::string pretty_sexp(const sexp& x, std::size_t width = 80);

/// The edit distance between `a` and `b`: insertions, deletions,
/// substitutions and transpositions of two neighbouring characters (optimal
/// string alignment), each one edit.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The name of `known` closest to `given` by `edit_distance`, if it is close
/// enough to be a likely typo: at most 1 edit for a name of up to 4
/// characters, 2 up to 8, 3 beyond. Leading dashes are ignored on both
/// sides, so `--tarce` finds `--trace`. Ties go to the first in `known`;
/// nothing when `given` is empty or nothing is close.
std::optional<std::string> closest_name(std::string_view given,
                                        const std::vector<std::string>& known);

} // namespace multidev::tools
