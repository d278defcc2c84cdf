#define BOOST_TEST_MODULE sexp
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

using multidev::parse_sexp;
using multidev::sexp;

BOOST_AUTO_TEST_CASE(test_sexp_round_trips_atoms_lists_and_quoted_strings) {
  auto x = sexp::list({sexp::atom("device"), sexp::field("name", "multidev_cpu:0:1"),
                       sexp::atom("two words"), sexp::atom(""), sexp::atom("a\"b\\c\n"),
                       sexp::list()});
  auto text = x.to_string();
  BOOST_TEST(text == R"((device (name multidev_cpu:0:1) "two words" "" "a\"b\\c\n" ()))");
  BOOST_TEST((parse_sexp(text) == x));
}

BOOST_AUTO_TEST_CASE(test_sexp_parser_reports_line_and_column) {
  try {
    parse_sexp("(a\n  (b c)\n  d");
    BOOST_FAIL("expected a parse error");
  } catch (const multidev::sexp_parse_error& e) {
    BOOST_TEST(e.line() == 1);
    BOOST_TEST(e.column() == 1);
    BOOST_TEST(std::string(e.what()).find("unclosed") != std::string::npos);
  }
  try {
    parse_sexp("(a b))");
    BOOST_FAIL("expected a parse error");
  } catch (const multidev::sexp_parse_error& e) {
    BOOST_TEST(e.line() == 1);
    BOOST_TEST(e.column() == 6);
  }
  BOOST_CHECK_THROW(parse_sexp("\"open"), multidev::sexp_parse_error);
  BOOST_CHECK_THROW(parse_sexp(""), multidev::sexp_parse_error);
}

BOOST_AUTO_TEST_CASE(test_sexp_parses_sequences_with_comments_and_positions) {
  auto xs = multidev::parse_sexps("; header\n(one 1)\n  (two ; trailing\n 2)\n");
  BOOST_TEST_REQUIRE(xs.size() == 2u);
  BOOST_TEST(xs[1].line == 3);
  BOOST_TEST(xs[1].column == 3);
  BOOST_TEST(xs[1].items()[1].as_atom() == "2");
  BOOST_TEST(xs[0].find("one") == nullptr); // find looks into sub-lists
  auto outer = sexp::list({xs[0], xs[1]});
  BOOST_TEST_REQUIRE(outer.find("two") != nullptr);
  BOOST_CHECK_THROW(xs[0].as_atom(), std::logic_error);
}

BOOST_AUTO_TEST_CASE(test_sexp_every_interface_type_prints) {
  multidev::tnode t{3, "w", 16, multidev::memory_mode::materialized};
  BOOST_TEST(to_sexp(t).to_string() == "(tnode (id 3) (label w) (size 16) (mode materialized))");
  BOOST_TEST(to_sexp(multidev::buffer_loc{2, 8}).to_string() == "(buffer_loc (pool_id 2) (offset 8))");
  BOOST_TEST(to_sexp(multidev::hardware_limits{}).find("max_threads_per_block")->items()[1].as_atom()
             == "none");
  multidev::task_spec spec{"fill", {multidev::buffer_arg{{1, 0}, 8}, 2.5}};
  BOOST_TEST(to_sexp(spec).to_string() == "(fill (buffer (pool 1) (offset 0) (size 8)) 2.5)");
  for (auto m : {multidev::memory_mode::effectively_constant, multidev::memory_mode::virtual_,
                 multidev::memory_mode::device_only})
    BOOST_TEST((multidev::memory_mode_from_string(to_string(m)) == m));
  BOOST_TEST(!multidev::memory_mode_from_string("bogus"));
}
