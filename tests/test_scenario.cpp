// Scenario scripts: each class of script error points at the exact
// line:col, no input crashes or hangs the loader or the tool, the outputs of
// a run describe every item and edge, and the same script and seed give the
// same logical trace.
#define BOOST_TEST_MODULE scenario
#include <boost/test/unit_test.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <malloc.h>
#include <sstream>
#include <streambuf>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "scenario/program.hpp"
#include "scenario/scenario.hpp"

using namespace multidev;
namespace scn = multidev::scenario;

namespace {

/// The script error `text` gets, as `line:col: message`.
std::string error_of(const std::string& text) {
  try {
    scn::load(text, "t.scn");
  } catch (const scn::script_error& e) {
    return std::to_string(e.where().line) + ":" + std::to_string(e.where().column) + ": "
           + e.message();
  }
  return "no error";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string examples_dir() {
  return std::string{MULTIDEV_SOURCE_DIR} + "/examples/scenarios/";
}

std::string read(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

} // namespace

// -- script errors, one test per class ----------------------------------------

BOOST_AUTO_TEST_CASE(test_scenario_syntax_errors_point_at_the_character) {
  auto e = error_of("(devices 2)\n(kernel 0 spin_ns 0\n");
  BOOST_TEST(e == "2:1: unclosed '(' (end of input reached)");
  e = error_of("(devices 2)\n  (sync a))\n");
  BOOST_TEST(e == "2:11: unexpected ')'");
  e = error_of("(devices 2)\n(scenario \"open\n");
  BOOST_TEST(e == "2:11: unterminated string");
}

BOOST_AUTO_TEST_CASE(test_scenario_unknown_names_point_at_the_name) {
  auto e = error_of("(devices 2)\n(tnode w (floats 4))\n(context c 0)\n(alloc c w)\n"
                    "(kernel c scale v 2.0)\n");
  BOOST_TEST(e == "5:17: unknown tnode 'v'");
  e = error_of("(devices 2)\n(sync nowhere)\n");
  BOOST_TEST(e == "2:7: unknown event 'nowhere'");
  e = error_of("(devices 2)\n(frobnicate 1)\n");
  BOOST_TEST(starts_with(e, "2:2: unknown form 'frobnicate'"), e);
  e = error_of("(devices 2)\n(kernel 1 no_such_kernel)\n");
  BOOST_TEST(starts_with(e, "2:11: unknown kernel 'no_such_kernel'; the kernels are "), e);
  e = error_of("(devices 2)\n(kernel 2 spin_ns 0)\n");
  BOOST_TEST(e == "2:9: device 2 does not exist: the scenario has 2 device(s), ordinals 0 to 1");
}

BOOST_AUTO_TEST_CASE(test_scenario_wrong_types_point_at_the_value) {
  auto e = error_of("(devices 2)\n(tnode w (floats 4))\n(context c 0)\n(alloc c w)\n"
                    "(kernel c scale w two)\n");
  BOOST_TEST(e == "5:19: argument 2 of kernel 'scale' must be a number, got 'two'");
  e = error_of("(devices 2)\n(tnode w (floats 4))\n(sync w)\n");
  BOOST_TEST(e == "3:7: 'w' is a tnode (declared at 2:8), expected an event");
  e = error_of("(devices two)\n");
  BOOST_TEST(e == "1:10: the number of devices must be a whole number, got 'two'");
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as a))\n(expect (state a) finished)\n");
  BOOST_TEST(starts_with(e, "3:19: unknown state 'finished'"), e);
}

BOOST_AUTO_TEST_CASE(test_scenario_duplicate_names_point_at_the_second) {
  auto e = error_of("(devices 2)\n(tnode w (floats 4))\n(context w 0)\n");
  BOOST_TEST(e == "3:10: duplicate name 'w': already a tnode declared at 2:8");
  e = error_of("(devices 2)\n(kernel 0 spin_ns 0 (as a))\n  (kernel 1 spin_ns 0 (as a))\n");
  BOOST_TEST(e == "3:27: duplicate name 'a': already an event declared at 2:25");
}

BOOST_AUTO_TEST_CASE(test_scenario_errors_inside_loops_name_the_iteration_text) {
  // The error points into the loop body, and the message shows the name the
  // loop variable made.
  auto e = error_of("(devices 2)\n(repeat 3\n  (kernel 0 spin_ns 0 (as a$i))\n"
                    "  (kernel 0 spin_ns 0 (as a1)))\n");
  BOOST_TEST(e == "3:27: duplicate name 'a1': already an event declared at 4:27");
}

BOOST_AUTO_TEST_CASE(test_scenario_a_fault_that_never_triggers_is_an_error) {
  auto e = error_of("(devices 1)\n(fail-at 0 3 \"boom\")\n(kernel 0 spin_ns 0)\n");
  BOOST_TEST(e == "2:1: fail-at: device 0 runs only 1 kernel(s), never a kernel number 3");
}

// -- no input crashes the loader -----------------------------------------------

/// Loads `text`: it must load or throw script_error, nothing else.
void loads_or_refuses(const std::string& text, const std::string& what) {
  try {
    scn::load(text, "corpus.scn");
  } catch (const scn::script_error&) {
  } catch (const std::exception& e) {
    BOOST_ERROR(what << ": threw " << e.what() << " instead of a script_error");
  }
}

BOOST_AUTO_TEST_CASE(test_scenario_loader_survives_truncated_unbalanced_huge_and_binary_input) {
  // The examples and the files they include (examples/scenarios/lib/).
  for (const auto& entry : std::filesystem::recursive_directory_iterator{examples_dir()}) {
    if (!entry.is_regular_file())
      continue;
    auto text = read(entry.path());
    // Every prefix (truncated input), and every prefix with a stray ')' or
    // '(' after it (unbalanced input).
    for (std::size_t n = 0; n <= text.size(); n += 3) {
      loads_or_refuses(text.substr(0, n), entry.path().string() + " truncated");
      loads_or_refuses(text.substr(0, n) + ")", entry.path().string() + " unbalanced");
      loads_or_refuses(text.substr(0, n) + "(", entry.path().string() + " unbalanced");
    }
  }
  // Huge: deep nesting, a huge atom, a loop asking for too many steps.
  loads_or_refuses(std::string(200'000, '(') + std::string(200'000, ')'), "deep");
  loads_or_refuses("(devices 1)\n(sync " + std::string(1 << 20, 'x') + ")", "huge atom");
  auto e = error_of("(devices 1)\n(repeat 100000 (repeat 1000 (var j) (kernel 0 spin_ns 0)))\n");
  BOOST_TEST(e == "2:1: (repeat 100000 ...) would expand to 100000000 steps, more than the limit of 2000000", e);
  // Binary: random bytes, and random bytes after a valid header.
  std::mt19937 rng{7};
  for (int i = 0; i < 300; ++i) {
    std::string bytes(1 + rng() % 400, '\0');
    for (auto& c : bytes)
      c = static_cast<char>(rng());
    loads_or_refuses(bytes, "binary");
    loads_or_refuses("(devices 2)\n(" + bytes, "binary after a header");
  }
}

BOOST_AUTO_TEST_CASE(test_scenario_loader_refuses_overflow_endless_loops_and_long_regexes) {
  // The inputs of fuzz/corpus/scenario/regress-*.scn. Arithmetic past the
  // 64-bit range was undefined behaviour, and INT64_MIN / -1 and INT64_MIN
  // mod -1 trapped (SIGFPE): now a script error, or the right value.
  BOOST_TEST(error_of("(devices (* 9223372036854775807 2))")
             == "1:10: (* ...) overflows a 64-bit integer in the number of devices");
  BOOST_TEST(error_of("(devices (+ 9223372036854775807 1))")
             == "1:10: (+ ...) overflows a 64-bit integer in the number of devices");
  BOOST_TEST(error_of("(devices (- -9223372036854775808 1))")
             == "1:10: (- ...) overflows a 64-bit integer in the number of devices");
  BOOST_TEST(error_of("(devices (/ -9223372036854775808 -1))")
             == "1:10: (/ ...) overflows a 64-bit integer in the number of devices");
  BOOST_TEST(error_of("(devices (mod -9223372036854775808 -1))")
             == "1:10: the number of devices must be between 1 and 256, got 0");
  BOOST_TEST(error_of("(devices (mod 9223372036854775806 9223372036854775807))")
             == "1:10: the number of devices must be between 1 and 256, "
                "got 9223372036854775806");
  // mod keeps the sign of its divisor.
  BOOST_TEST(error_of("(devices (+ 300 (mod -1 4)))")
             == "1:10: the number of devices must be between 1 and 256, got 303");
  BOOST_TEST(error_of("(devices (+ 300 (mod 7 -3)))")
             == "1:10: the number of devices must be between 1 and 256, got 298");
  // Loops that make no steps ran forever: the step limit never saw them.
  BOOST_TEST(error_of("(devices 1)\n(repeat 2000000 (repeat 2000000 (var j)))\n")
             == "2:17: the script expands to more than the limit of 8000000 forms and loop "
                "iterations");
  // A long (matches RE) overflowed the stack in std::regex's compiler.
  auto re = [](std::size_t n) {
    return "(devices 1)\n(all-work 0 (as e))\n(expect (sync e) (fails (matches \""
           + std::string(n, 'a') + "\")))\n";
  };
  BOOST_TEST(error_of(re(1000)) == "no error");
  BOOST_TEST(error_of(re(200'000))
             == "3:34: a regular expression may have at most 1000 characters, this one has "
                "200000");
}

BOOST_AUTO_TEST_CASE(test_scenario_matches_a_long_message_without_recursing_per_character) {
  // std::regex_search recursed once per character of the message: `.*y`
  // over a failure message of 200,000 characters overflowed the stack
  // (SIGSEGV) of the runner's thread. A fail-at message makes it that long.
  std::string message(200'000, 'x');
  message += 'y';
  auto p = scn::load("(devices 1)\n(fail-at 0 1 \"" + message
                       + "\")\n(kernel 0 spin_ns 0 (as k))\n"
                         "(expect (sync k) (fails (matches \".*y\")))\n"
                         "(expect (sync k) (fails (matches \"^x+z\")))\n",
                     "t.scn");
  auto r = scn::run(*p);
  BOOST_TEST_REQUIRE(r.expectations.size() == 2u);
  BOOST_TEST(r.expectations[0].held, scn::summary(r));
  BOOST_TEST(!r.expectations[1].held); // and a miss is still a miss
  // Back-references would need the recursive matcher: refused when loading.
  auto e = error_of("(devices 1)\n(all-work 0 (as e))\n"
                    "(expect (sync e) (fails (matches \"(a)\\\\1\")))\n");
  BOOST_TEST(starts_with(e, "3:34: bad regular expression '(a)\\1': "), e);
}

// -- the tool's exit status on bad input ---------------------------------------

/// Runs the tool (its path is the test's first argument) on `args`; returns
/// its exit status, its stderr in `err` and, when `out` is given, its stdout.
int run_tool(const std::vector<std::string>& args, std::string& err,
             std::string* out = nullptr) {
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_TEST_REQUIRE(suite.argc >= 2, "the test needs the multidev tool's path as argument");
  auto err_file = std::filesystem::temp_directory_path()
                  / ("scenario-err-" + std::to_string(getpid()));
  auto out_file = std::filesystem::temp_directory_path()
                  / ("scenario-out-" + std::to_string(getpid()));
  std::vector<std::string> all{suite.argv[1]};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out)
    posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
  else
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  BOOST_TEST_REQUIRE(rc == 0);
  int status = 0;
  waitpid(pid, &status, 0);
  err = read(err_file);
  std::filesystem::remove(err_file);
  if (out) {
    *out = read(out_file);
    std::filesystem::remove(out_file);
  }
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

BOOST_AUTO_TEST_CASE(test_scenario_tool_exits_2_with_the_location_on_bad_scripts) {
  auto dir = std::filesystem::temp_directory_path() / ("scenario-corpus-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937 rng{11};
  std::string binary(2048, '\0');
  for (auto& c : binary)
    c = static_cast<char>(rng());
  std::string quick = read(examples_dir() + "quickstart.scn");
  std::map<std::string, std::string> corpus = {
    {"truncated.scn", quick.substr(0, quick.find("(kernel c0 scale") + 10)},
    {"unbalanced.scn", quick + ")"},
    {"deep.scn", std::string(100'000, '(')},
    {"huge.scn", "(devices 1)\n(repeat 1000000 (repeat 1000000 (var j) (kernel 0 spin_ns 0)))\n"},
    {"binary.scn", binary},
    {"empty.scn", ""},
  };
  for (const auto& [name, text] : corpus) {
    auto path = (dir / name).string();
    std::ofstream{path, std::ios::binary} << text;
    std::string err;
    int status = run_tool({"run", path}, err);
    BOOST_TEST(status == 2, name << ": exit status " << status << ", stderr: " << err);
    BOOST_TEST(starts_with(err, path + ":"), name << ": stderr: " << err);
    BOOST_TEST(std::count(err.begin(), err.end(), '\n') == 1, name << ": stderr: " << err);
  }
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(test_scenario_tool_exits_1_when_an_expectation_fails) {
  auto path = std::filesystem::temp_directory_path() / ("scenario-fails-" + std::to_string(getpid()) + ".scn");
  std::ofstream{path} << "(devices 1)\n(kernel 0 spin_ns 0 (as a))\n(expect (state a) failed)\n";
  std::string err;
  BOOST_TEST(run_tool({"run", path.string()}, err) == 1, err);
  std::filesystem::remove(path);
}

// -- honest verdicts (issue 39 point 4) -----------------------------------------

std::string tests_dir() {
  return std::string{MULTIDEV_SOURCE_DIR} + "/tests/scenarios/";
}

BOOST_AUTO_TEST_CASE(test_scenario_items_failed_with_no_expectation_fail_the_run) {
  // A fail kernel poisons a copy and a to-host on two other devices; nothing
  // blocks on them and no expectation looks. The run printed "PASSED: 0 of 0
  // expectation(s) held" and exited 0; each failed item must be named, with
  // its device and error, and the run must fail.
  auto p = scn::load_file(tests_dir() + "unexpected_poison.scn");
  auto r = scn::run(*p);
  BOOST_TEST(!r.ok(), scn::summary(r));
  BOOST_TEST(r.expectations.empty());
  std::vector<std::string> got;
  for (const auto& u : r.unexpected)
    got.push_back(std::to_string(u.where.line) + " " + u.text + " | "
                  + u.observed.substr(0, u.observed.find(':')));
  std::vector<std::string> want{"11 (kernel 0 fail boom (as broken)) | failed on device 0",
                                "12 (wait c1 broken) | failed on device 1",
                                "13 (copy w (from c0) (to c1) (as moved)) | failed on device 1",
                                "14 (wait c2 broken) | failed on device 2",
                                "15 (to-host c2 w (as out)) | failed on device 2"};
  BOOST_TEST(got == want, boost::test_tools::per_element());
  for (const auto& u : r.unexpected)
    BOOST_TEST(u.observed.find("task 'fail boom' failed: boom") != std::string::npos,
               u.observed);
  auto text = scn::summary(r);
  BOOST_TEST(text.find("PASSED") == std::string::npos, text);
  BOOST_TEST(text.find("FAILED: 0 of 0 expectation(s) held, 5 unexpected failure(s)")
               != std::string::npos,
             text);
  BOOST_TEST(scn::report(r).find("verdict")->items()[1].as_atom() == "failed");

  // The tool: exit status 1, each unexpected failure on stdout.
  std::string err, out;
  BOOST_TEST(run_tool({"run", tests_dir() + "unexpected_poison.scn"}, err, &out) == 1,
             out << err);
  BOOST_TEST(out.find("PASSED") == std::string::npos, out);
  BOOST_TEST(out.find("unexpected_poison.scn:13:1: (copy w (from c0) (to c1) (as moved))\n"
                      "    failed on device 1: multidev_cpu:1:")
               != std::string::npos,
             out);
  BOOST_TEST(out.find("unexpected_poison.scn:15:1: (to-host c2 w (as out))\n"
                      "    failed on device 2: multidev_cpu:2:")
               != std::string::npos,
             out);
}

/// The unexpected failures of a run of `text`, as "line observed".
std::vector<std::string> unexpected_of(const std::string& text, bool& ok) {
  auto r = scn::run(*scn::load(text, "cover.scn"));
  ok = r.ok();
  std::vector<std::string> out;
  for (const auto& u : r.unexpected)
    out.push_back(std::to_string(u.where.line) + " " + u.observed);
  return out;
}

BOOST_AUTO_TEST_CASE(test_scenario_an_expectation_that_saw_a_failure_covers_its_poisoned_items) {
  // docs/scenarios.md, "Expected failures": an expectation that saw a
  // failure (its origin) covers every item that failed from it, upstream
  // and downstream of what it looked at; not a failure of another origin.
  std::string base = read(tests_dir() + "unexpected_poison.scn");
  for (const char* seen : {"(expect (sync broken) (fails (matches \"boom\")))",
                           "(expect (sync moved) (fails (origin 0)))",
                           "(expect (state broken) failed)",
                           "(expect (host out) (all 2))", // fails, but it looked
                           "(expect (await 1) (fails (matches \"boom\")))"}) {
    bool ok = false;
    auto u = unexpected_of(base + seen + "\n", ok);
    BOOST_TEST(u.empty(), seen << ": " << (u.empty() ? "" : u.front()));
  }
  // Two failures of different origins: the one no expectation saw is named.
  bool ok = true;
  auto u = unexpected_of("(devices 2)\n(kernel 0 fail one (as a))\n(kernel 1 fail two (as b))\n"
                         "(expect (sync a) (fails (matches one)))\n",
                         ok);
  BOOST_TEST(!ok);
  BOOST_TEST_REQUIRE(u.size() == 1u);
  BOOST_TEST(u[0].find("3 failed on device 1: ") == 0, u[0]);
  BOOST_TEST(u[0].find("failed: two") != std::string::npos, u[0]);
  // A cancelled item is a failure too, covered once an expectation saw the
  // cancellation (the hold is cancelled as well when the runner had not
  // started it yet: one cancel, one origin).
  const std::string cancel = "(devices 1)\n(hold 0 (as h))\n(kernel 0 spin_ns 0 (as q))\n"
                             "(cancel 0)\n(release h)\n(await 0)\n";
  u = unexpected_of(cancel, ok);
  BOOST_TEST(!ok);
  BOOST_TEST_REQUIRE(!u.empty());
  BOOST_TEST(u.back().find("3 cancelled on device 0: ") == 0, u.back());
  u = unexpected_of(cancel + "(expect (state q) cancelled)\n", ok);
  BOOST_TEST(ok);
  BOOST_TEST(u.empty());
}

BOOST_AUTO_TEST_CASE(test_scenario_tool_checks_output_paths_before_the_run) {
  // An output file that cannot be written was found only after the whole
  // run (exit 1, the summary printed). It is now a usage error (exit 2, one
  // line naming the option and the path) before anything runs.
  auto script = examples_dir() + "quickstart.scn";
  auto dir = std::filesystem::temp_directory_path()
             / ("scenario-outputs-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto missing = (dir / "no-such-dir" / "t.json").string();
  for (auto [option, path] : {std::pair<std::string, std::string>{"--trace", missing},
                              {"--report", dir.string()}, // a directory
                              {"--timeline", missing},
                              {"--logical-trace", missing}}) {
    std::string err, out;
    int status = run_tool({"run", script, option, path}, err, &out);
    BOOST_TEST(status == 2, option << ": " << out << err);
    BOOST_TEST(out.empty(), option << ": the run went ahead: " << out);
    BOOST_TEST(starts_with(err, "multidev: " + option + " " + path + ": cannot write there: "),
               err);
    BOOST_TEST(std::count(err.begin(), err.end(), '\n') == 1, err);
  }
  // A writable path is left as it was when the script is wrong.
  auto bad = (dir / "bad.scn").string();
  std::ofstream{bad} << "(devices 0)\n";
  auto fresh = (dir / "fresh.json").string();
  std::string err;
  BOOST_TEST(run_tool({"run", bad, "--trace", fresh}, err) == 2, err);
  BOOST_TEST(!std::filesystem::exists(fresh));
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(test_scenario_progress_line_fits_the_terminal_and_shows_the_time) {
  // The live line ran past 80 columns with a few devices, so each redraw in
  // an 80x24 terminal left a wrapped line behind; it had no elapsed time.
  std::vector<scn::device_progress> ps(16, scn::device_progress{123'456'789, 987'654'321});
  auto line = scn::progress_line(ps, 12.34, 80);
  BOOST_TEST(line.size() <= 79u, line); // the last column stays free
  BOOST_TEST(starts_with(line, "12.3 s  "), line);
  BOOST_TEST(line.find("items done") != std::string::npos, line);
  BOOST_TEST(line.find("d0 123456789/987654321") != std::string::npos, line);
  BOOST_TEST(line.find("...") != std::string::npos, line); // the devices that did not fit
  for (char c : line)
    BOOST_TEST((c >= ' ' && c <= '~'), "a control character in " << line);
  // Every device when they fit; a narrow terminal still gets a whole line.
  auto wide = scn::progress_line(ps, 125, 1000);
  BOOST_TEST(wide.find("d15 ") != std::string::npos, wide);
  BOOST_TEST(wide.find("...") == std::string::npos, wide);
  BOOST_TEST(starts_with(wide, "2 min 05 s  "), wide);
  for (std::size_t w : {1u, 2u, 10u, 40u, 80u, 81u, 200u})
    BOOST_TEST(scn::progress_line(ps, 3725, w).size() <= std::max<std::size_t>(w - 1, 1),
               "width " << w);
  BOOST_TEST(scn::elapsed_text(3725) == "1 h 02 min");
}

// -- what a run produces -------------------------------------------------------

scn::run_result run_example(const std::string& name, std::optional<uint64_t> seed = {}) {
  auto p = scn::load_file(examples_dir() + name, seed);
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), scn::summary(r));
  return r;
}

BOOST_AUTO_TEST_CASE(test_scenario_chrome_trace_has_every_item_and_every_edge) {
  auto r = run_example("pipeline.scn");
  auto doc = nlohmann::json::parse(scn::chrome_trace_json(r));
  const auto& events = doc.at("traceEvents");
  // Slices by (tid, name), flows by id.
  std::multimap<std::pair<int, std::string>, const nlohmann::json*> slices;
  std::map<uint64_t, std::pair<const nlohmann::json*, const nlohmann::json*>> flows;
  std::set<int> named_threads;
  for (const auto& e : events) {
    auto ph = e.at("ph").get<std::string>();
    if (ph == "X")
      slices.emplace(std::pair{e.at("tid").get<int>(), e.at("name").get<std::string>()}, &e);
    else if (ph == "s")
      flows[e.at("id").get<uint64_t>()].first = &e;
    else if (ph == "f")
      flows[e.at("id").get<uint64_t>()].second = &e;
    else if (ph == "M" && e.at("name") == "thread_name")
      named_threads.insert(e.at("tid").get<int>());
  }
  BOOST_TEST(named_threads.size() == 5u); // four devices and the host
  // Every item of the logical trace is a slice on its device's track.
  std::map<std::pair<int, int>, std::string> desc;
  std::size_t items = 0;
  for (const auto& x : r.logical.items()) {
    if (!x.is_list() || x.items()[0].as_atom() != "device")
      continue;
    int d = std::stoi(x.items()[1].as_atom());
    for (std::size_t i = 2; i < x.items().size(); ++i) {
      const auto& it = x.items()[i];
      auto name = it.find("description")->items()[1].as_atom();
      auto step = std::stoi(it.find("step")->items()[1].as_atom());
      desc[{d, step}] = name;
      ++items;
      BOOST_TEST(slices.count({d, name}) > 0, "no slice '" << name << "' on device " << d);
    }
  }
  BOOST_TEST(items == 36u);
  // Every edge between devices is a flow from a slice of the awaited item to
  // the device that waited, each end inside a slice of its track.
  auto inside = [&](const nlohmann::json& f, const std::string& name) {
    auto [lo, hi] = slices.equal_range({f.at("tid").get<int>(), name});
    for (auto it = lo; it != hi; ++it) {
      double ts = it->second->at("ts"), dur = it->second->at("dur");
      if (f.at("ts").get<double>() >= ts && f.at("ts").get<double>() <= ts + dur)
        return true;
    }
    return false;
  };
  std::size_t edges = 0;
  for (const auto& e : r.logical.find("edges")->items()) {
    if (e.is_atom())
      continue;
    int fd = std::stoi(e.items()[1].items()[1].as_atom());
    int fs = std::stoi(e.items()[1].items()[2].as_atom());
    int td = std::stoi(e.items()[2].items()[1].as_atom());
    if (fd == td)
      continue;
    ++edges;
    bool found = false;
    for (const auto& [id, f] : flows) {
      if (!f.first || !f.second || f.first->at("tid") != fd || f.second->at("tid") != td)
        continue;
      if (inside(*f.first, desc[{fd, fs}])) {
        found = true;
        BOOST_TEST(f.second->at("bp") == "e");
      }
    }
    BOOST_TEST(found, "no flow for the edge " << e.to_string());
  }
  BOOST_TEST(edges == 12u); // three hops for each of four batches
}

BOOST_AUTO_TEST_CASE(test_scenario_same_script_and_seed_give_the_same_logical_trace) {
  auto a = scn::logical_trace(run_example("random_dag.scn", 5));
  auto b = scn::logical_trace(run_example("random_dag.scn", 5));
  auto c = scn::logical_trace(run_example("random_dag.scn", 6));
  BOOST_TEST(a == b);
  BOOST_TEST(a != c); // the seed draws another DAG
  // No wall time in it: the timeline has times, the logical trace has none.
  BOOST_TEST(a.find("start_ns") == std::string::npos);
  BOOST_TEST(a.find("end_ns") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(test_scenario_failed_expectations_report_what_was_observed) {
  auto p = scn::load("(devices 2)\n(tnode w (floats 8))\n(context c 1)\n"
                     "(from-host c w (fill 2))\n(to-host c w (as h))\n"
                     "(expect (host h) (all 3))\n(expect (host h) (sum 16))\n",
                     "obs.scn");
  auto r = scn::run(*p);
  BOOST_TEST(!r.ok());
  BOOST_TEST_REQUIRE(r.expectations.size() == 2u);
  BOOST_TEST(!r.expectations[0].held);
  BOOST_TEST(r.expectations[0].observed == "element 0 is 2");
  BOOST_TEST(r.expectations[0].where.str() == "obs.scn:6:1");
  BOOST_TEST(r.expectations[1].held);
  auto rep = scn::report(r);
  BOOST_TEST(rep.find("verdict")->items()[1].as_atom() == "failed");
  BOOST_TEST(scn::summary(r).find("FAILED obs.scn:6:1") != std::string::npos, scn::summary(r));
}

BOOST_AUTO_TEST_CASE(test_scenario_a_forgotten_hold_does_not_hang_a_sync) {
  // The sync waits behind a hold that is never released: the step timeout
  // ends it as an unexpected failure, and the end of the run releases the hold.
  auto p = scn::load("(devices 1)\n(hold 0 (as h))\n(kernel 0 spin_ns 0 (as a))\n(sync a)\n",
                     "hold.scn");
  scn::run_options o;
  o.step_timeout_s = 0.5;
  auto r = scn::run(*p, o);
  BOOST_TEST(!r.ok());
  BOOST_TEST_REQUIRE(r.unexpected.size() == 1u);
  BOOST_TEST(r.unexpected[0].where.str() == "hold.scn:4:1");
  BOOST_TEST(r.unexpected[0].observed.find("did not finish within 0.5 s") != std::string::npos,
             r.unexpected[0].observed);
}

BOOST_AUTO_TEST_CASE(test_scenario_sync_in_learns_at_once_that_an_expected_failure_made_no_event) {
  // The step that makes `missing` fails inside (expect ... (fails)): the
  // sync-in task waiting for the event must fail at once, naming the event
  // never made, as it does when the step fails outside an expect (issue 36
  // point 10). The delay makes the task start waiting after the host's sync
  // began: had the task not been told, the host's sync would reach the step
  // timeout first and the expectation would read "did not finish within".
  auto p = scn::load("(devices 2)\n"
                     "(fail-at 1 1 \"boom\")\n"
                     "(kernel 1 spin_ns 0 (as broken))\n"
                     "(expect (sync broken) (fails (matches \"boom\")))\n"
                     "(delay 0 300)\n"
                     "(sync-in 0 missing (as blocked))\n"
                     "(expect (kernel 1 spin_ns 0 (as missing)) (fails (matches \"boom\")))\n"
                     "(expect (sync blocked) (fails (matches \"was never made\")))\n",
                     "never_made.scn");
  scn::run_options o;
  o.step_timeout_s = 20;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), scn::summary(r));
  BOOST_TEST_REQUIRE(r.expectations.size() == 3u);
  BOOST_TEST(r.expectations[2].where.str() == "never_made.scn:8:1");
  BOOST_TEST(r.expectations[2].held, r.expectations[2].observed);
  BOOST_TEST(r.expectations[2].observed.find("sync-in: event 'missing' was never made")
               != std::string::npos,
             r.expectations[2].observed);
  BOOST_TEST(r.expectations[2].observed.find("did not finish") == std::string::npos,
             r.expectations[2].observed);
}

BOOST_AUTO_TEST_CASE(test_scenario_logical_trace_shows_write_after_read_edges) {
  // Device 1 copies w from device 0, then device 0 overwrites w: the runtime
  // makes the writer wait for the copy (write-after-read), and the logical
  // trace says so, with the Lamport clock that follows from it.
  auto p = scn::load("(scenario war)\n(devices 2)\n(tnode w (floats 8))\n"
                     "(context c0 0)\n(context c1 1)\n"
                     "(from-host c0 w (fill 1))\n"
                     "(copy w (from c0) (to c1) (as moved))\n"
                     "(kernel c0 scale w 2 (as scaled))\n"
                     "(expect (sync scaled) ok)\n"
                     "(expect (before moved scaled))\n",
                     "war.scn");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), scn::summary(r));
  auto text = scn::logical_trace(r);
  BOOST_TEST(text.find("(edge (from 0 1) (to 1 1) (kind copy))") != std::string::npos, text);
  BOOST_TEST(text.find("(edge (from 1 1) (to 0 2) (kind war))") != std::string::npos, text);
  BOOST_TEST(text.find("(item (step 2) (clock 3) (kind task) (description \"scale w 2\")")
               != std::string::npos,
             text);
}

BOOST_AUTO_TEST_CASE(test_scenario_timeline_svg_is_well_formed_with_a_lane_per_device) {
  auto r = run_example("gradient_merge.scn");
  auto svg = scn::timeline_svg(r);
  BOOST_TEST(starts_with(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  BOOST_TEST(svg.find("</svg>") != std::string::npos);
  for (int d = 0; d < 4; ++d)
    BOOST_TEST(svg.find(">device " + std::to_string(d) + " (") != std::string::npos);
  BOOST_TEST(svg.find("marker-end=\"url(#arrow)\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(test_scenario_a_nodes_device_written_name_k_is_a_fresh_context_in_kernel_and_wait) {
  // docs/scenarios.md: `kernel` and `wait` take a device where a context is
  // expected, meaning a fresh context on it, and a node's device may be
  // written NAME/K. A declared context of that spelling is still the context.
  const std::string text = "(devices 1)\n(nodes (n 2))\n"
                           "(kernel n/1 spin_ns 0 (as k))\n"       // step 0
                           "(wait n/0 k)\n"                        // step 1
                           "(kernel n/0 spin_ns 0 (as on_n))\n"    // step 2
                           "(wait 0 on_n)\n"                       // step 3
                           "(kernel 0 spin_ns 0 (as back))\n"      // step 4
                           "(expect (sync back) ok)\n"
                           "(expect (before k on_n))\n(expect (before on_n back))\n";
  auto p = scn::load(text, "name_k.scn");
  std::vector<std::string> kernel_and_wait; // "device ctx" of each kernel and wait step
  for (const auto& st : p->steps)
    if (st.kind == scn::op::kernel || st.kind == scn::op::wait)
      kernel_and_wait.push_back(std::to_string(st.device) + " " + std::to_string(st.ctx));
  std::vector<std::string> expected{"2 -1", "1 -1", "1 -1", "0 -1", "0 -1"};
  BOOST_TEST(kernel_and_wait == expected, boost::test_tools::per_element());
  auto e = error_of("(devices 1)\n(nodes (n 2))\n(kernel m/0 spin_ns 0)\n");
  BOOST_TEST(e == "3:9: unknown node 'm' in 'm/0'", e);
  e = error_of("(devices 1)\n(nodes (n 2))\n(wait n/2 k)\n");
  BOOST_TEST(starts_with(e, "3:7: 'n/2': node n has 2 device(s)"), e);
  auto named = scn::load("(devices 1)\n(nodes (n 1))\n(context n/0 0)\n(kernel n/0 spin_ns 0)\n",
                         "named.scn");
  BOOST_TEST(named->steps.back().ctx == 0);
  BOOST_TEST(named->steps.back().device == 0);
  // And it runs, on a node process started for it.
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_TEST_REQUIRE(suite.argc >= 2, "the test needs the multidev tool's path as argument");
  scn::run_options o;
  o.spawn_nodes = true;
  o.tool = suite.argv[1];
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), scn::summary(r));
}

// -- faults aimed by name (issue 42 point 3) ------------------------------------

namespace {

/// The slice of the item whose event is `ev` (the first, and it must exist).
/// A fault aimed at an iteration of a loop kept once (`event_family`):
/// the iteration's text, and the fault.
struct iteration_fault {
  std::string text;
  std::optional<std::string> fail_with;
  double held_ms = 0;
};

/// By event id, the faults aimed at the iterations of `st`, a step of a
/// loop kept once that binds an event.
std::map<int, iteration_fault> iteration_faults(const scn::program& p, const scn::step& st) {
  std::map<int, iteration_fault> out;
  const auto& fam = p.families.at(static_cast<std::size_t>(st.family));
  auto k = static_cast<std::size_t>(&st - &p.steps[fam.step]);
  for (uint64_t t = 0; t < fam.times; ++t) {
    auto id = st.as + static_cast<int>(t) * fam.per_iter;
    if (auto it = p.family_faults.find(id); it != p.family_faults.end())
      out[id] = iteration_fault{scn::family_text(fam, k, static_cast<int64_t>(t)),
                                it->second.fail_with, it->second.held_ms};
  }
  return out;
}

/// Each iteration's event name and its `delay-at`, for `st` as above.
std::vector<std::pair<std::string, double>> iteration_holds(const scn::program& p,
                                                            const scn::step& st) {
  std::vector<std::pair<std::string, double>> out;
  auto faults = iteration_faults(p, st);
  const auto& fam = p.families.at(static_cast<std::size_t>(st.family));
  for (uint64_t t = 0; t < fam.times; ++t) {
    auto id = st.as + static_cast<int>(t) * fam.per_iter;
    auto it = faults.find(id);
    out.emplace_back(p.event_name(id), it != faults.end() ? it->second.held_ms : 0);
  }
  return out;
}

const scn::slice& slice_of(const scn::run_result& r, const std::string& ev) {
  for (const auto& s : r.tl.slices)
    if (s.event == ev)
      return s;
  throw std::runtime_error("no slice has the event " + ev);
}

/// The observed text of every expectation that did not hold, one a line.
std::string failed_expectations(const scn::run_result& r) {
  std::string out;
  for (const auto& e : r.expectations)
    if (!e.held)
      out += e.where.str() + ": " + e.text + ": " + e.observed + "\n";
  return out + scn::summary(r);
}

} // namespace

BOOST_AUTO_TEST_CASE(test_scenario_fail_at_an_event_fails_that_loop_iteration_only) {
  // fail-at mark3 comes before the loop that makes mark0..mark5: exactly
  // the fourth kernel throws (those before it ran, the one after fails only
  // because the device failed, from mark3's origin). fail-at after the step
  // works too, on a delay task and on an expected action. Device 0 is held
  // until the loop is queued (a failed device would refuse mark4).
  auto p = scn::load("(devices 2)\n"
                     "(fail-at mark3 \"boom $i\")\n"
                     "(hold 0 (as h))\n"
                     "(repeat 6 (kernel 0 spin_ns 0 (as mark$i)))\n"
                     "(release h)\n"
                     "(expect (state mark2) done)\n"
                     "(expect (sync mark3) (fails (matches \"boom \\\\$i$\") (origin 0) "
                     "(task \"spin_ns 0\")))\n"
                     "(expect (state mark4) failed)\n"
                     "(recover 0)\n"
                     "(delay 1 1 (as nap))\n"
                     "(delay 1 1 (as nap2))\n"
                     "(fail-at nap2 \"late\")\n"
                     "(expect (kernel 0 spin_ns 0 (as act)) ok)\n"
                     "(fail-at act \"acted\")\n"
                     "(expect (state nap) done)\n"
                     "(expect (sync nap2) (fails (matches \"late\") (origin 1) "
                     "(task \"delay 1 ms\")))\n"
                     "(expect (sync act) (fails (matches \"acted\")))\n",
                     "fail_at.scn");
  std::vector<std::string> failing;
  for (const auto& st : p->steps) {
    const auto& s = st.action ? *st.action : st;
    if (s.fail_with)
      failing.push_back(s.text + " -> " + *s.fail_with);
    // A loop kept once (its names differ only): the faults aimed at its
    // iterations' events.
    if (s.family >= 0)
      for (const auto& [id, it] : iteration_faults(*p, s))
        if (it.fail_with)
          failing.push_back(it.text + " -> " + *it.fail_with);
  }
  std::vector<std::string> expected{"(kernel 0 spin_ns 0 (as mark3)) -> boom $i",
                                    "(delay 1 1 (as nap2)) -> late",
                                    "(kernel 0 spin_ns 0 (as act)) -> acted"};
  BOOST_TEST(failing == expected, boost::test_tools::per_element());
  scn::run_options o;
  o.step_timeout_s = 20;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), failed_expectations(r));
  BOOST_TEST(!slice_of(r, "mark2").failed);
  BOOST_TEST(slice_of(r, "mark3").failed);
}

BOOST_AUTO_TEST_CASE(test_scenario_delay_at_holds_only_the_named_item) {
  // b is held 60 ms on device 0's runner before it runs: its slice lasts
  // that long, a and c do not, and c (queued behind b) starts after it.
  auto p = scn::load("(devices 2)\n"
                     "(repeat 3 (var j) (kernel 0 spin_ns 0 (as k$j)))\n"
                     "(delay-at k1 60)\n"
                     "(kernel 1 spin_ns 0 (as other))\n"
                     "(expect (sync k2) ok)\n"
                     "(expect (before k1 k2))\n",
                     "delay_at.scn");
  scn::run_options o;
  o.step_timeout_s = 20;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), failed_expectations(r));
  auto ms = [&](const std::string& ev) {
    const auto& s = slice_of(r, ev);
    return static_cast<double>(s.end_ns - s.start_ns) / 1e6;
  };
  BOOST_TEST(ms("k1") >= 60.0);
  // Nothing else is held: read from the loaded program, since a time bound
  // on the other slices would fail on a loaded machine, not on a defect.
  int held = 0;
  for (const auto& st : p->steps) {
    if (st.as < 0)
      continue;
    std::vector<std::pair<std::string, double>> items{{p->event_name(st.as), st.held_ms}};
    if (st.family >= 0)
      items = iteration_holds(*p, st);
    for (const auto& [name, ms] : items) {
      BOOST_TEST((ms > 0) == (name == "k1"), name << " held " << ms << " ms");
      held += ms > 0;
    }
  }
  BOOST_TEST(held == 1);
  BOOST_TEST(slice_of(r, "k2").start_ns >= slice_of(r, "k1").end_ns);
}

BOOST_AUTO_TEST_CASE(test_scenario_cancel_at_cancels_only_the_named_item) {
  // k1 resolves cancelled; k0 was queued behind a 20 ms kernel, so a
  // (cancel 0) right before k1 would have dropped it too: it must run. k2,
  // queued after k1, runs; device 1, waiting on k1, fails from the cancel
  // (held until dependent is queued: k1 is cancelled already when the wait
  // is, and a device that failed would refuse dependent).
  auto p = scn::load("(devices 2)\n"
                     "(cancel-at k1)\n"
                     "(kernel 0 spin_ns 20000000 (as slow))\n"
                     "(kernel 0 spin_ns 0 (as k0))\n"
                     "(kernel 0 spin_ns 0 (as k1))\n"
                     "(kernel 0 spin_ns 0 (as k2))\n"
                     "(hold 1 (as h1))\n"
                     "(wait 1 k1)\n"
                     "(kernel 1 spin_ns 0 (as dependent))\n"
                     "(release h1)\n"
                     "(expect (state k0) done)\n"
                     "(expect (sync k1) (fails (cancelled)))\n"
                     "(expect (state k2) done)\n"
                     "(expect (sync dependent) (fails (matches \"cancelled\") (origin 0)))\n"
                     "(expect (kernel 0 spin_ns 0) ok)\n",
                     "cancel_at.scn");
  BOOST_TEST(p->items[0] == 6u); // the hold before k1 is an item
  scn::run_options o;
  o.step_timeout_s = 20;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), failed_expectations(r));
  BOOST_TEST(slice_of(r, "k1").kind == "cancel");
  BOOST_TEST(slice_of(r, "k0").kind == "task");
  BOOST_TEST(!slice_of(r, "k0").failed);
  BOOST_TEST(slice_of(r, "k2").kind == "task");
  BOOST_TEST(!slice_of(r, "k2").failed);
}

BOOST_AUTO_TEST_CASE(test_scenario_faults_aimed_by_name_are_checked_at_load) {
  // An unknown name: the event's place, the form and the name.
  auto e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(fail-at nope \"x\")\n");
  BOOST_TEST(e == "3:10: fail-at: unknown event 'nope': no step of the script makes it", e);
  e = error_of("(devices 1)\n(delay-at k7 3)\n(repeat 3 (kernel 0 spin_ns 0 (as k$i)))\n");
  BOOST_TEST(e == "2:11: delay-at: unknown event 'k7': no step of the script makes it", e);
  e = error_of("(devices 1)\n\n  (cancel-at ghost)\n");
  BOOST_TEST(e == "3:14: cancel-at: unknown event 'ghost': no step of the script makes it", e);
  // A host buffer, a hold, a tnode: not events.
  e = error_of("(devices 1)\n(tnode t (floats 4))\n(context c 0)\n(from-host c t (fill 1))\n"
               "(to-host c t (as out))\n(fail-at out \"x\")\n");
  BOOST_TEST(starts_with(e, "6:10: fail-at: 'out' is a host buffer (declared at 5:18), not an "
                            "event"),
             e);
  e = error_of("(devices 1)\n(hold 0 (as h))\n(cancel-at h)\n");
  BOOST_TEST(starts_with(e, "3:12: cancel-at: 'h' is a hold (declared at 2:13), not an event"), e);
  e = error_of("(devices 1)\n(tnode t (floats 4))\n(delay-at t 1)\n");
  BOOST_TEST(starts_with(e, "3:11: delay-at: 't' is a tnode (declared at 2:8), not an event"), e);
  // An event that no task makes.
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0)\n(all-work 0 (as all))\n(fail-at all \"x\")\n");
  BOOST_TEST(starts_with(e, "4:10: fail-at: event 'all' is made by (all-work ...) at 3:1, which "
                            "is not a task"),
             e);
  // One fault a task; delay-at's range; none of the runner's closures on a node.
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(fail-at k \"x\")\n(cancel-at k)\n");
  BOOST_TEST(e == "4:1: cancel-at: the task of event 'k' already has a fault, (fail-at k x) at "
                  "3:1: a task takes one",
             e);
  e = error_of("(devices 1)\n(fail-at 0 1 \"x\")\n(kernel 0 spin_ns 0 (as k))\n(fail-at k \"y\")\n");
  BOOST_TEST(starts_with(e, "4:1: fail-at: the task of event 'k' already has a fault, a (fail-at "
                            "0 K ...)"),
             e);
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(delay-at k 0)\n");
  BOOST_TEST(starts_with(e, "3:13: delay-at: a delay must be above 0"), e);
  e = error_of("(devices 1)\n(nodes (n 1))\n(kernel n/0 spin_ns 0 (as k))\n(cancel-at k)\n");
  BOOST_TEST(starts_with(e, "4:1: cancel-at needs a closure on the device's runner"), e);
  // A delay and a sync-in on an event made before load on a node's device
  // (issue 42 point 5); a sync-in there on an event made later does not,
  // nor does a hold.
  BOOST_CHECK_NO_THROW(scn::load("(devices 1)\n(nodes (n 1))\n(delay n/0 5 (as d))\n"
                                 "(kernel 0 spin_ns 0 (as k))\n(sync-in n/0 k (as s))\n"
                                 "(fail-at d \"x\")\n",
                                 "node_forms.scn"));
  e = error_of("(devices 1)\n(nodes (n 1))\n(sync-in n/0 later)\n(kernel 0 spin_ns 0 (as later))\n");
  BOOST_TEST(starts_with(e, "3:14: sync-in on n/0 (device 1): event 'later' is not made by an "
                            "earlier step. On a node's device sync-in is a wait"),
             e);
  e = error_of("(devices 1)\n(nodes (n 1))\n(hold n/0 (as h))\n");
  BOOST_TEST(starts_with(e, "3:1: hold needs a closure on the device's runner"), e);
  e = error_of("(devices 1)\n(nodes (n 1))\n(delay n/0 1 (as d))\n(delay-at d 1)\n");
  BOOST_TEST(starts_with(e, "4:1: delay-at needs a closure on the device's runner"), e);
  // fail-at on a node's kernel loads (a named `fail` task travels).
  BOOST_CHECK_NO_THROW(
    scn::load("(devices 1)\n(nodes (n 1))\n(kernel n/0 spin_ns 0 (as k))\n(fail-at k \"x\")\n",
              "node_fail.scn"));
  // The counted form still works, and still needs three arguments.
  e = error_of("(devices 1)\n(fail-at 0 \"x\" \"y\" \"z\")\n");
  BOOST_TEST(starts_with(e, "2:1: (fail-at ...) takes 2 to 3 arguments"), e);
}

BOOST_AUTO_TEST_CASE(test_scenario_kill_node_at_an_event_stops_the_node_right_after_its_step) {
  // Node b is killed right after the step that makes m1 (m1 is running a
  // 5 s kernel then): m0, synced before, is done; m1 is lost with the node;
  // the step itself was accepted (no unexpected failure at line 6), and the
  // local device goes on. cut-node-at shares the path (a SIGSTOP instead).
  auto p = scn::load("(devices 1)\n(nodes (b 1))\n"
                     "(kill-node-at m1)\n"
                     "(kernel b/0 spin_ns 0 (as m0))\n"
                     "(sync m0)\n"
                     "(kernel b/0 spin_ns 5000000000 (as m1))\n"
                     "(expect (sync m1) (fails (matches \"b/multidev_cpu\")))\n"
                     "(expect (state m0) done)\n"
                     "(expect (kernel 0 spin_ns 0) ok)\n",
                     "kill_node_at.scn");
  BOOST_TEST(p->steps[2].node_fault == 0);
  BOOST_TEST(!p->steps[2].node_cut);
  BOOST_TEST(p->steps[0].node_fault == -1);
  auto e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(kill-node-at k)\n");
  BOOST_TEST(e == "3:15: kill-node-at: event 'k' is made on device 0, not on a node's device: "
                  "name the node, (kill-node-at k NODE)",
             e);
  e = error_of("(devices 1)\n(nodes (b 1))\n(kernel 0 spin_ns 0 (as k))\n(cut-node-at k c)\n");
  BOOST_TEST(e == "4:16: unknown node 'c'", e);
  e = error_of("(devices 1)\n(nodes (b 1))\n(kernel b/0 spin_ns 0)\n(cut-node-at gone)\n");
  BOOST_TEST(e == "4:14: cut-node-at: unknown event 'gone': no step of the script makes it", e);
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_TEST_REQUIRE(suite.argc >= 2, "the test needs the multidev tool's path as argument");
  scn::run_options o;
  o.spawn_nodes = true;
  o.tool = suite.argv[1];
  o.step_timeout_s = 20;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), failed_expectations(r));
  BOOST_TEST(r.unexpected.empty());
  bool killed_on_host = false;
  for (const auto& s : r.tl.slices)
    killed_on_host |= s.kind == "host" && s.name == "kill-node b";
  BOOST_TEST(killed_on_host);
}

// -- host steps: sleep and resolved (issue 42 point 2) --------------------------

BOOST_AUTO_TEST_CASE(test_scenario_sleep_waits_on_the_host_for_its_time) {
  auto p = scn::load("(devices 1)\n(kernel 0 spin_ns 0 (as a))\n(sleep 30ms)\n"
                     "(kernel 0 spin_ns 0 (as b))\n(sleep 250us)\n(sleep 0.002s)\n(sleep 1)\n"
                     "(delay-at b 3ms)\n(expect (sync b) ok)\n",
                     "sleep.scn");
  std::vector<double> ms;
  for (const auto& st : p->steps)
    if (starts_with(st.text, "(sleep "))
      ms.push_back(st.ms);
  std::vector<double> expected{30, 0.25, 2, 1};
  BOOST_TEST(ms == expected, boost::test_tools::per_element());
  BOOST_TEST(p->steps[2].held_ms == 3.0);
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
  const scn::slice* nap = nullptr;
  for (const auto& s : r.tl.slices)
    if (s.kind == "host" && s.name == "sleep 30 ms")
      nap = &s;
  BOOST_TEST_REQUIRE(nap != nullptr);
  BOOST_TEST(nap->end_ns - nap->start_ns >= 30'000'000);
  // b was queued after the sleep: it cannot have started before it ended.
  BOOST_TEST(slice_of(r, "b").start_ns >= nap->end_ns);
  auto e = error_of("(devices 1)\n(sleep 5min)\n");
  BOOST_TEST(starts_with(e, "2:8: the time to sleep must be a number of milliseconds or a time "
                            "such as 5ms"),
             e);
  e = error_of("(devices 1)\n(sleep 61s)\n");
  BOOST_TEST(e == "2:8: a sleep must be 0 to 60000 ms, got 61000 ms", e);
  e = error_of("(devices 1)\n(sleep)\n");
  BOOST_TEST(starts_with(e, "2:1: (sleep ...) takes 1 argument: (sleep TIME)"), e);
}

BOOST_AUTO_TEST_CASE(test_scenario_resolved_is_checked_at_once_with_what_was_seen) {
  // k is queued behind a hold: (resolved k) says pending at once (had it
  // waited, the hold would have made it time out: the step timeout is 5 s
  // and nothing releases the hold before it). After the release and a sync,
  // done; a failed event is resolved too.
  auto p = scn::load("(devices 1)\n(hold 0 (as h))\n(kernel 0 spin_ns 0 (as k))\n"
                     "(expect (resolved k) false)\n"  // 0: holds
                     "(expect (resolved k))\n"        // 1: fails, pending
                     "(release h)\n(sync k)\n"
                     "(expect (resolved k))\n"        // 2: holds, done
                     "(expect (resolved k) false)\n"  // 3: fails, done
                     "(fail-at f \"boom\")\n(kernel 0 spin_ns 0 (as f))\n"
                     "(expect (sync f) (fails (matches \"boom\")))\n" // 4
                     "(expect (resolved f))\n",       // 5: holds, failed
                     "resolved.scn");
  scn::run_options o;
  o.step_timeout_s = 5;
  auto t0 = std::chrono::steady_clock::now();
  auto r = scn::run(*p, o);
  bool quick = std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4);
  BOOST_TEST(quick);
  BOOST_TEST_REQUIRE(r.expectations.size() == 6u);
  std::vector<std::string> got;
  for (const auto& x : r.expectations)
    got.push_back((x.held ? "held " : "FAILED ") + x.observed);
  std::vector<std::string> expected{"held pending", "FAILED pending", "held resolved: done",
                                    "FAILED resolved: done", got[4], "held resolved: failed"};
  BOOST_TEST(got == expected, boost::test_tools::per_element());
  BOOST_TEST(r.expectations[4].held);
  BOOST_TEST(r.expectations[1].where.str() == "resolved.scn:5:1");
  auto e = error_of("(devices 1)\n(hold 0 (as h))\n(expect (resolved h))\n");
  BOOST_TEST(starts_with(e, "3:19: 'h' is a hold (declared at 2:13), expected an event"), e);
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(expect (resolved k) maybe)\n");
  BOOST_TEST(e == "3:22: expected true or false, got 'maybe'", e);
}

// -- time assertions (issue 42 point 2) -----------------------------------------

namespace {

/// The run's expectations as "held OBSERVED" or "FAILED OBSERVED".
std::vector<std::string> outcomes(const scn::run_result& r) {
  std::vector<std::string> got;
  for (const auto& x : r.expectations)
    got.push_back((x.held ? "held " : "FAILED ") + x.observed);
  return got;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_scenario_await_hold_waits_until_the_runner_is_in_the_hold) {
  // slow (20 ms) is queued before h: once the runner is in h, slow is done,
  // so (resolved slow) holds at once. Without the wait it would read pending.
  // A hold behind a failed task never runs: await-hold says so, not hangs.
  auto p = scn::load("(devices 2)\n(kernel 0 spin_ns 20000000 (as slow))\n(hold 0 (as h))\n"
                     "(await-hold h)\n(expect (resolved slow))\n(release h)\n"
                     "(hold 1 (as g1))\n(kernel 1 fail \"boom\" (as f))\n(hold 1 (as g2))\n"
                     "(release g1)\n(await-hold g2)\n(expect (sync f) (fails (matches \"boom\")))\n",
                     "await_hold.scn");
  scn::run_options o;
  o.step_timeout_s = 5;
  auto r = scn::run(*p, o);
  BOOST_TEST_REQUIRE(r.expectations.size() == 2u);
  BOOST_TEST(r.expectations[0].held, r.expectations[0].observed);
  BOOST_TEST(r.expectations[1].held, r.expectations[1].observed);
  BOOST_TEST_REQUIRE(!r.unexpected.empty());
  BOOST_TEST(r.unexpected[0].where.str() == "await_hold.scn:11:1");
  BOOST_TEST(r.unexpected[0].observed == "await-hold: hold 'g2' on device 1 failed without running",
             r.unexpected[0].observed);
  bool drawn = false;
  for (const auto& s : r.tl.slices)
    drawn |= s.kind == "host" && s.name == "await-hold h";
  BOOST_TEST(drawn);
  auto e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k))\n(await-hold k)\n");
  BOOST_TEST(starts_with(e, "3:13: 'k' is an event (declared at 2:25), expected a hold"), e);
}

BOOST_AUTO_TEST_CASE(test_scenario_time_assertions_hold_when_the_schedule_forces_them) {
  // Every bound here is forced: the holds are both entered (await-hold)
  // before either opens, so they overlap and two devices are busy at once;
  // a 3 ms delay sits between b and a on one device; device 3 waits for x.
  // The only upper bound, (within a 120s), cannot fail unless the sync of a
  // ran out of the 5 s step timeout.
  auto p = scn::load("(devices 4)\n(hold 0 (as h0))\n(hold 1 (as h1))\n"
                     "(await-hold h0)\n(await-hold h1)\n(release h0)\n(release h1)\n"
                     "(expect (overlap h0 h1))\n"                 // 0
                     "(expect (concurrency (0 1) 2))\n"           // 1
                     "(expect (concurrency (0 1) (at-least 2)))\n" // 2
                     "(kernel 2 spin_ns 0 (as b))\n(delay 2 3)\n(kernel 2 spin_ns 0 (as a))\n"
                     "(expect (after a b (at-least 2ms)))\n"      // 3
                     "(expect (after a b))\n"                     // 4
                     "(expect (sync a) ok)\n"                     // 5
                     "(expect (within a 120s))\n"                 // 6
                     "(kernel 2 spin_ns 1000000 (as x))\n(wait 3 x)\n(kernel 3 spin_ns 1000000)\n"
                     "(expect (concurrency (2 3) (at-most 1)))\n", // 7
                     "timed.scn");
  scn::run_options o;
  o.step_timeout_s = 5;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.ok(), failed_expectations(r));
  auto got = outcomes(r);
  BOOST_TEST_REQUIRE(got.size() == 8u);
  BOOST_TEST(starts_with(got[0], "held h0 ran "), got[0]);
  BOOST_TEST(contains(got[0], ": they overlap "), got[0]);
  BOOST_TEST(starts_with(got[1], "held at most 2 of the 2 device(s) busy at once, first at "),
             got[1]);
  BOOST_TEST(contains(got[1], "(devices 0 1)"), got[1]);
  BOOST_TEST(starts_with(got[3], "held a started "), got[3]);
  BOOST_TEST(contains(got[3], " after b ended"), got[3]);
  BOOST_TEST(starts_with(got[6], "held a resolved "), got[6]);
  BOOST_TEST(contains(got[6], " after its step began"), got[6]);
  BOOST_TEST(starts_with(got[7], "held at most 1 of the 2 device(s) busy at once"), got[7]);
}

BOOST_AUTO_TEST_CASE(test_scenario_time_assertions_fail_with_the_observed_value) {
  // Each of these cannot hold: the holds are forced to overlap, b ends
  // before a starts on one device with 3 ms between them, and a is held
  // 5 ms by delay-at, so it cannot resolve within 1 ms of its step.
  auto p = scn::load("(devices 3)\n(hold 0 (as h0))\n(hold 1 (as h1))\n"
                     "(await-hold h0)\n(await-hold h1)\n(release h0)\n(release h1)\n"
                     "(expect (concurrency (0 1) (at-most 1)))\n" // 0
                     "(kernel 2 spin_ns 0 (as b))\n(delay 2 3)\n(kernel 2 spin_ns 0 (as a))\n"
                     "(expect (after b a))\n"                     // 1
                     "(expect (after a b (at-most 1ms)))\n"       // 2
                     "(expect (overlap a b))\n"                   // 3
                     "(delay-at a 5ms)\n"
                     "(expect (within a 1ms))\n"                  // 4
                     "(expect (concurrency (2) (at-least 1)))\n"  // 5: holds
                     "(expect (after h0 b))\n",                   // 6
                     "timed_fail.scn");
  scn::run_options o;
  o.step_timeout_s = 5;
  auto r = scn::run(*p, o);
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.unexpected.empty());
  auto got = outcomes(r);
  BOOST_TEST_REQUIRE(got.size() == 7u);
  BOOST_TEST(starts_with(got[0], "FAILED at most 2 of the 2 device(s) busy at once, first at "),
             got[0]);
  BOOST_TEST(contains(got[0], " ns (devices 0 1)"), got[0]);
  BOOST_TEST(starts_with(got[1], "FAILED b started "), got[1]);
  BOOST_TEST(contains(got[1], " before a ended (b started at "), got[1]);
  BOOST_TEST(starts_with(got[2], "FAILED a started "), got[2]);
  BOOST_TEST(contains(got[2], " ms after b ended"), got[2]);
  BOOST_TEST(starts_with(got[3], "FAILED a ran "), got[3]);
  BOOST_TEST(contains(got[3], " ms apart"), got[3]);
  BOOST_TEST(starts_with(got[4], "FAILED a resolved "), got[4]);
  BOOST_TEST(contains(got[4], " ms after its step began (the step at "), got[4]);
  BOOST_TEST(starts_with(got[5], "held at most 1 of the 1 device(s)"), got[5]);
  BOOST_TEST(starts_with(got[6], "FAILED h0 started "), got[6]);
  BOOST_TEST(contains(got[6], " before b ended"), got[6]);
  BOOST_TEST(r.expectations[4].where.str() == "timed_fail.scn:16:1");
}

BOOST_AUTO_TEST_CASE(test_scenario_time_assertions_are_checked_at_load) {
  auto pre = std::string{"(devices 2)\n(hold 0 (as h0))\n(kernel 1 spin_ns 0 (as k))\n"};
  auto e = error_of(pre + "(expect (overlap x h0))\n");
  BOOST_TEST(e == "4:18: unknown event or hold 'x'", e);
  e = error_of(pre + "(expect (after k h0 (at-least -1ms)))\n");
  BOOST_TEST(e == "4:31: the time of (at-least T) must be 0 to 86400 s, got -1 ms", e);
  e = error_of(pre + "(expect (after k h0 (at-least 2ms) (at-least 1ms)))\n");
  BOOST_TEST(e == "4:36: (at-least ...) is given twice", e);
  e = error_of(pre + "(expect (after k h0 (at-least 2ms) (at-most 1ms)))\n");
  BOOST_TEST(e == "4:36: (at-least T) is above (at-most T)", e);
  e = error_of(pre + "(expect (after k h0 (soon)))\n");
  BOOST_TEST(starts_with(e, "4:21: expected (at-least T) or (at-most T)"), e);
  e = error_of(pre + "(expect (within h0 1ms))\n");
  BOOST_TEST(e == "4:17: 'h0' is a hold (declared at 2:13), expected an event", e);
  e = error_of(pre + "(expect (within k))\n");
  BOOST_TEST(starts_with(e, "4:9: (within ...) takes 2 argument(s)"), e);
  e = error_of(pre + "(expect (concurrency (0 0) 1))\n");
  BOOST_TEST(e == "4:25: device 0 is listed twice", e);
  e = error_of(pre + "(expect (concurrency (0 1) 3))\n");
  BOOST_TEST(starts_with(e, "4:28: a number of devices busy at once must be 0 to 2"), e);
  e = error_of(pre + "(expect (concurrency 0 1))\n");
  BOOST_TEST(e == "4:22: expected the devices as a list, e.g. (0 1 2), or all", e);
  e = error_of(pre + "(expect (concurrency (0 1) (at-least 2) (at-most 1)))\n");
  BOOST_TEST(e == "4:9: (at-least 2) is above (at-most 1)", e);
  e = error_of(pre + "(expect (concurrency (0 1) (most 1)))\n");
  BOOST_TEST(e == "4:28: expected (at-least N) or (at-most N)", e);
  e = error_of(pre + "(expect (overlap k h0) true)\n");
  BOOST_TEST(e == "4:1: (expect (overlap ...) ...) takes 0 predicate(s)", e);
}

// -- reuse: include (issue 42 point 4) ------------------------------------------

namespace {

/// A fresh directory under the temp dir with `files` (name, text) written.
std::filesystem::path script_dir(const std::string& tag,
                                 const std::vector<std::pair<std::string, std::string>>& files) {
  auto dir = std::filesystem::temp_directory_path()
             / ("multidev_scn_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (const auto& [name, text] : files) {
    auto p = dir / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream{p} << text;
  }
  return dir;
}

/// The script error loading `path` gets, whole (`file:line:col: message`).
std::string file_error_of(const std::filesystem::path& path) {
  try {
    scn::load_file(path.string());
  } catch (const scn::script_error& e) {
    return e.what();
  }
  return "no error";
}

} // namespace

BOOST_AUTO_TEST_CASE(test_scenario_include_reads_a_file_relative_to_the_includer) {
  // lib/steps.scn includes its neighbour by a path relative to itself; its
  // steps keep their own file and line; the included forms may come
  // before (devices N) (a shared header declaring them).
  auto dir = script_dir("inc", {{"main.scn", "(include \"lib/devs.scn\")\n(include "
                                             "\"lib/steps.scn\")\n(expect (sync k) ok)\n"},
                                {"lib/devs.scn", "(devices 2)\n"},
                                {"lib/steps.scn", "(include \"more.scn\")\n(wait 1 first)\n"
                                                  "(kernel 1 spin_ns 0 (as k))\n"},
                                {"lib/more.scn", "(kernel 0 spin_ns 0 (as first))\n"}});
  auto p = scn::load_file((dir / "main.scn").string());
  BOOST_TEST_REQUIRE(p->steps.size() == 4u);
  BOOST_TEST(p->steps[0].where.str() == (dir / "lib/more.scn").string() + ":1:1");
  BOOST_TEST(p->steps[2].where.str() == (dir / "lib/steps.scn").string() + ":3:1");
  BOOST_TEST(p->steps[3].where.str() == (dir / "main.scn").string() + ":3:1");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(test_scenario_include_errors_name_both_files_and_cycles_are_refused) {
  auto dir = script_dir("incerr",
                        {{"bad.scn", "(devices 1)\n(include \"sub/typo.scn\")\n"},
                         {"sub/typo.scn", "(kernel 0 spin_ns 0)\n(kernel 0 nosuch)\n"},
                         {"a.scn", "(devices 1)\n(include \"b.scn\")\n"},
                         {"b.scn", "(include \"a.scn\")\n"},
                         {"self.scn", "(devices 1)\n(include \"self.scn\")\n"},
                         {"missing.scn", "(devices 1)\n(include \"gone.scn\")\n"},
                         {"unbalanced.scn", "(devices 1)\n(include \"open.scn\")\n"},
                         {"open.scn", "(kernel 0 spin_ns 0\n"}});
  auto d = dir.string() + "/";
  auto e = file_error_of(dir / "bad.scn");
  BOOST_TEST(starts_with(e, d + "sub/typo.scn:2:11: unknown kernel 'nosuch'"), e);
  BOOST_TEST(contains(e, " (in the file included at " + d + "bad.scn:2:1)"), e);
  e = file_error_of(dir / "a.scn");
  BOOST_TEST(e == d + "b.scn:1:10: include cycle: " + d + "a.scn includes " + d + "b.scn includes "
                  + d + "a.scn again (in the file included at " + d + "a.scn:2:1)",
             e);
  e = file_error_of(dir / "self.scn");
  BOOST_TEST(e == d + "self.scn:2:10: include cycle: " + d + "self.scn includes " + d
                  + "self.scn again",
             e);
  e = file_error_of(dir / "missing.scn");
  BOOST_TEST(e == d + "missing.scn:2:10: cannot read the included file '" + d + "gone.scn'", e);
  e = file_error_of(dir / "unbalanced.scn");
  BOOST_TEST(e == d + "open.scn:1:1: unclosed '(' (end of input reached) (in the file included at "
                  + d + "unbalanced.scn:2:1)",
             e);
  e = error_of("(devices 1)\n(include \"/dev/zero\")\n");
  BOOST_TEST(e == "2:10: cannot read the included file '/dev/zero': not a regular file", e);
  // A regular file need not be small: past 64 MiB the include is refused.
  {
    std::ofstream big{dir / "big.scn", std::ios::binary};
    std::string spaces(std::size_t{1} << 20, ' ');
    for (int i = 0; i <= 64; ++i)
      big << spaces;
  }
  auto huge = script_dir("inchuge", {{"main.scn", "(devices 1)\n(include \"" + d + "big.scn\")\n"}});
  e = file_error_of(huge / "main.scn");
  BOOST_TEST(contains(e, "main.scn:2:10: the included file '" + d + "big.scn' is larger than 64 MiB"), e);
  std::filesystem::remove(dir / "big.scn");
  e = error_of("(devices 1)\n(include)\n");
  BOOST_TEST(starts_with(e, "2:1: (include ...) takes 1 argument"), e);
  std::filesystem::remove_all(dir);
}

// -- reuse: params and names built from expressions (issue 42 point 4) ------------

BOOST_AUTO_TEST_CASE(test_scenario_params_are_read_like_loop_variables) {
  auto text = std::string{"(param n 3)\n(param dev 1)\n(devices 2)\n"
                          "(repeat $n (var i) (kernel $dev spin_ns (* $i 10) (as k$i)))\n"
                          "(expect (sync k${n-1}) ok)\n"};
  // (The loop differs in a name and an affine argument only: it is kept
  // once, its last iteration's text made from its first.)
  auto p = scn::load(text, "param.scn");
  BOOST_TEST_REQUIRE(p->steps.size() == 2u);
  BOOST_TEST_REQUIRE(p->families.size() == 1u);
  BOOST_TEST(p->steps[0].device == 1);
  BOOST_TEST(scn::family_text(p->families[0], 0, 2) == "(kernel 1 spin_ns (* 2 10) (as k2))");
  BOOST_TEST(p->steps[1].text == "(expect (sync k2) ok)");
  p = scn::load(text, "param.scn", std::nullopt, {{"n", "5"}, {"dev", "0"}});
  BOOST_TEST_REQUIRE(p->steps.size() == 2u);
  BOOST_TEST_REQUIRE(p->families.size() == 1u);
  BOOST_TEST(p->steps[0].device == 0);
  BOOST_TEST(scn::family_text(p->families[0], 0, 4) == "(kernel 0 spin_ns (* 4 10) (as k4))");
  BOOST_TEST(p->steps[1].text == "(expect (sync k4) ok)");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
  auto err = [&](const std::string& t, const std::map<std::string, std::string>& ps) {
    try {
      scn::load(t, "param.scn", std::nullopt, ps);
    } catch (const scn::script_error& e) {
      return std::string{e.what()};
    }
    return std::string{"no error"};
  };
  BOOST_TEST(err(text, {{"m", "5"}}) == "param.scn:0:0: --param m=5: the script has no (param m ...)");
  BOOST_TEST(err(text, {{"n", "x"}}) == "param.scn:1:1: --param n=x: the value must be a whole number");
  BOOST_TEST(err("(param n 1)\n(param n 2)\n", {}) == "param.scn:2:8: parameter 'n' is declared twice");
  BOOST_TEST(err("(devices 1)\n(repeat 2 (param n 1))\n", {})
             == "param.scn:2:11: (param ...) must be outside every repeat (it holds for the rest "
                "of the script)");
  BOOST_TEST(err("(param i 1)\n(devices 1)\n(repeat 2 (kernel 0 spin_ns 0))\n", {})
             == "param.scn:3:1: loop variable '$i' is already a (param i ...)");
  BOOST_TEST(err("(param n.x 1)\n", {})
             == "param.scn:1:8: 'n.x' cannot name a parameter (letters, digits, _)");
}

BOOST_AUTO_TEST_CASE(test_scenario_names_are_built_from_expressions) {
  auto p = scn::load("(devices 2)\n(param base 10)\n"
                     "(repeat 2 (var r) (repeat 2 (var d)\n"
                     "  (kernel $d spin_ns ${base*r+d} (as mark$r.d${d+1}))))\n"
                     "(expect (sync mark1.d2) ok)\n(sync mark${-1+1}.d${base%3})\n",
                     "expr.scn");
  std::vector<std::string> texts;
  for (const auto& st : p->steps)
    texts.push_back(st.text);
  std::vector<std::string> expected{
    "(kernel 0 spin_ns 0 (as mark0.d1))", "(kernel 1 spin_ns 1 (as mark0.d2))",
    "(kernel 0 spin_ns 10 (as mark1.d1))", "(kernel 1 spin_ns 11 (as mark1.d2))",
    "(expect (sync mark1.d2) ok)", "(sync mark0.d1)"};
  BOOST_TEST(texts == expected, boost::test_tools::per_element());
  BOOST_TEST(scn::run(*p).ok());
  auto e = error_of("(devices 1)\n(repeat 2 (kernel 0 spin_ns ${i-}))\n");
  BOOST_TEST(e == "2:29: in '${i-}' of '${i-}': expected a number or a variable at the end", e);
  e = error_of("(devices 1)\n(repeat 2 (kernel 0 spin_ns 0 (as k${j})))\n");
  BOOST_TEST(e == "2:35: in '${j}' of 'k${j}': unknown variable 'j' (a loop variable or a param)",
             e);
  e = error_of("(devices 1)\n(repeat 2 (kernel 0 spin_ns ${i/0}))\n");
  BOOST_TEST(e == "2:29: in '${i/0}' of '${i/0}': division by zero", e);
  e = error_of("(devices 1)\n(kernel 0 spin_ns ${9223372036854775807*2})\n");
  BOOST_TEST(starts_with(e, "2:19: in '${9223372036854775807*2}'"), e);
  BOOST_TEST(contains(e, "outside the 64-bit range"), e);
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k${i))\n");
  BOOST_TEST(e == "2:25: unclosed '${' in 'k${i': write ${EXPR}, e.g. mark${d+1}", e);
}

// -- random DAGs with transfers, data and faults (issue 42 point 4) -----------

namespace {

/// The steps of a loaded script as text, one a line, with their faults.
std::string expanded(const scn::program& p) {
  std::string out;
  for (const auto& st : p.steps)
    out += st.text + (st.fail_with ? " fails " + *st.fail_with : "") + "\n";
  return out;
}

/// The expectation whose text starts with `head`, or null.
const scn::expectation_result* expectation(const scn::run_result& r, const std::string& head) {
  for (const auto& e : r.expectations)
    if (starts_with(e.text, head))
      return &e;
  return nullptr;
}

const char* dag_options_script =
  "(devices 3)\n"
  "(random-dag g (tasks 120) (max-deps 3) (work-ns 0) (transfers 0.5) (data) (faults 3))\n";

} // namespace

BOOST_AUTO_TEST_CASE(test_scenario_random_dag_options_are_drawn_from_the_seed) {
  auto a = scn::load(dag_options_script, "t.scn", 5);
  auto b = scn::load(dag_options_script, "t.scn", 5);
  auto c = scn::load(dag_options_script, "t.scn", 6);
  BOOST_TEST(expanded(*a) == expanded(*b));
  BOOST_TEST(a->dags[0].faults == b->dags[0].faults);
  BOOST_TEST(a->dags[0].expected == b->dags[0].expected);
  BOOST_TEST(expanded(*a) != expanded(*c));
  BOOST_TEST(a->dags[0].faults.size() == 3u);
  // The options draw from a generator of their own: the DAG a seed draws
  // (its devices and edges) is the same with them as without.
  auto plain = scn::load("(devices 3)\n(random-dag g (tasks 120) (max-deps 3) (work-ns 0))\n",
                         "t.scn", 5);
  BOOST_TEST(plain->dags[0].edges == a->dags[0].edges);
  // (transfers 1): every dependency on another device is a copy, no wait;
  // (transfers 0.5) without (data): some of each.
  auto copies = [](const scn::program& p) {
    std::map<scn::op, int> n;
    for (const auto& st : p.steps)
      ++n[st.kind];
    return n;
  };
  auto all = copies(*scn::load("(devices 3)\n(random-dag g (tasks 200) (transfers 1))\n", "t.scn"));
  BOOST_TEST(all[scn::op::copy] > 0);
  BOOST_TEST(all[scn::op::wait] == 0);
  auto half = copies(*scn::load("(devices 3)\n(random-dag g (tasks 200) (transfers 0.5))\n",
                                "t.scn"));
  BOOST_TEST(half[scn::op::copy] > 0);
  BOOST_TEST(half[scn::op::wait] > 0);
}

BOOST_AUTO_TEST_CASE(test_scenario_random_dag_with_transfers_data_and_faults_holds) {
  for (uint64_t seed : {1, 2, 3}) {
    auto p = scn::load(dag_options_script, "t.scn", seed);
    auto r = scn::run(*p);
    BOOST_TEST(r.ok(), scn::summary(r));
    auto* data = expectation(r, "(random-dag g): every task's data as computed");
    auto* faults = expectation(r, "(random-dag g): exactly the tasks its faults reach failed");
    BOOST_TEST_REQUIRE(data);
    BOOST_TEST_REQUIRE(faults);
    BOOST_TEST(data->held, data->observed);
    BOOST_TEST(faults->held, faults->observed);
    BOOST_TEST(starts_with(faults->observed, "3 fault(s) failed "), faults->observed);
  }
}

BOOST_AUTO_TEST_CASE(test_scenario_random_dag_data_check_fails_with_the_value) {
  auto p = scn::load("(devices 2)\n(random-dag g (tasks 40) (work-ns 0) (data))\n", "t.scn");
  // A value the host did not compute: the check names the task, what its
  // buffer held and what was expected.
  scn::program q = *p;
  auto want = q.dags[0].expected[7];
  q.dags[0].expected[7] = want + 1;
  auto r = scn::run(q);
  BOOST_TEST(!r.ok());
  auto* data = expectation(r, "(random-dag g): every task's data as computed");
  BOOST_TEST_REQUIRE(data);
  BOOST_TEST(!data->held);
  BOOST_TEST(data->observed == fmt::format("g.7 holds {} (element 0), expected {}", want,
                                           want + 1),
             data->observed);
}

BOOST_AUTO_TEST_CASE(test_scenario_random_dag_fault_check_fails_when_a_fault_did_not_fire) {
  auto p = scn::load("(devices 2)\n(random-dag g (tasks 60) (work-ns 0) (faults 2))\n", "t.scn");
  // The faults' tasks run their work instead of failing: the tasks they
  // should have failed are done, and the check says which.
  scn::program q = *p;
  for (auto& st : q.steps)
    st.fail_with.reset();
  auto r = scn::run(q);
  auto* faults = expectation(r, "(random-dag g): exactly the tasks its faults reach failed");
  BOOST_TEST_REQUIRE(faults);
  BOOST_TEST(!faults->held);
  auto first = *std::min_element(p->dags[0].faults.begin(), p->dags[0].faults.end());
  BOOST_TEST(starts_with(faults->observed, fmt::format("g.{}: fault ", first)),
             faults->observed);
  BOOST_TEST(contains(faults->observed, "reaches it, but it is done"), faults->observed);
}

BOOST_AUTO_TEST_CASE(test_scenario_random_dag_option_errors) {
  auto e = error_of("(devices 2)\n(random-dag g (tasks 4) (transfers 1.5))\n");
  BOOST_TEST(e == "2:36: the fraction of transfers must be between 0 and 1, got 1.5", e);
  e = error_of("(devices 2)\n(random-dag g (tasks 4) (data 1))\n");
  BOOST_TEST(e == "2:25: (data) takes no value", e);
  e = error_of("(devices 2)\n(random-dag g (tasks 4) (faults 5))\n");
  BOOST_TEST(e == "2:33: the number of faults must be between 0 and 4, got 5", e);
  e = error_of("(devices 2)\n(random-dag g (tasks 200000) (data))\n");
  BOOST_TEST(starts_with(e, "2:1: (random-dag g ...) with (transfers P), (data) or (faults K) "
                            "takes at most 100000 tasks"),
             e);
  e = error_of("(devices 1)\n(nodes (b 1))\n(random-dag g (tasks 4) (faults 1))\n");
  BOOST_TEST(contains(e, "device 1 is a node's, which cannot hold"), e);
  e = error_of("(devices 1 (queue-capacity 8))\n(random-dag g (tasks 10) (faults 1))\n");
  BOOST_TEST(contains(e, "more than its queue holds (8"), e);
}

// -- scale (issue 42 point 1) -----------------------------------------------------

BOOST_AUTO_TEST_CASE(test_scenario_alike_loop_iterations_load_once) {
  // Neither loop names its own variable or binds a name: each iteration is
  // the first one again, loaded once and run `times` times.
  auto p = scn::load("(devices 2)\n"
                     "(repeat 1000\n"
                     "  (kernel 0 spin_ns 0)\n"
                     "  (repeat 3 (var j) (kernel 1 spin_ns 0)))\n"
                     "(repeat 4 (kernel 1 spin_ns ${i}))\n",
                     "alike.scn");
  BOOST_TEST(p->steps.size() == 2u + 4u); // the ${i} loop is expanded
  BOOST_TEST_REQUIRE(p->repeats.size() == 2u);
  BOOST_TEST(p->repeats[0].first == 0u); // the outer loop first
  BOOST_TEST(p->repeats[0].count == 2u);
  BOOST_TEST(p->repeats[0].times == 1000u);
  BOOST_TEST(p->repeats[1].first == 1u);
  BOOST_TEST(p->repeats[1].count == 1u);
  BOOST_TEST(p->repeats[1].times == 3u);
  BOOST_TEST(p->steps_run == 4004u);
  BOOST_TEST(p->items == (std::vector<uint64_t>{1000, 3004}), boost::test_tools::per_element());
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), scn::summary(r));
  BOOST_TEST(r.items == (std::vector<uint64_t>{1000, 3004}), boost::test_tools::per_element());
  // The loader counted every kernel of the loop it read once.
  auto e = error_of("(devices 1)\n(repeat 5 (kernel 0 spin_ns 0))\n(fail-at 0 4 \"x\")\n");
  BOOST_TEST(e == "3:12: fail-at: the script schedules 5 kernel(s) on device 0 before this form, "
                  "so kernel number 4 is behind it",
             e);
  // A fail-at counting kernels ahead: the loop is expanded, kernel 7 fails.
  auto f = scn::load("(devices 1)\n(fail-at 0 7 \"boom\")\n(repeat 10 (kernel 0 spin_ns 0))\n",
                     "count.scn");
  BOOST_TEST(f->steps.size() == 10u);
  BOOST_TEST(f->repeats.empty());
  BOOST_TEST(f->steps[6].fail_with.value_or("") == "boom");
  // Past the limit, the same error as before, with the loop's place.
  e = error_of("(devices 1)\n(repeat 1000000 (kernel 0 spin_ns 0) (kernel 0 spin_ns 0)\n"
               "  (kernel 0 spin_ns 0))\n");
  BOOST_TEST(starts_with(e, "2:1: (repeat 1000000 ...) would expand to "), e);
  BOOST_TEST(contains(e, "steps, more than the limit of 2000000"), e);
  // Loops whose iterations differ otherwise than in names and affine
  // kernel arguments stay expanded (those are kept once, see
  // test_scenario_named_loop_iterations_load_once).
  auto loop = [](const std::string& body) { return "(devices 1)\n(repeat 3 " + body + ")\n"; };
  for (const char* body : {"(kernel 0 spin_ns ${i*2})", "(kernel 0 spin_ns ${0*i})",
                           "(kernel 0 spin_ns (* $i $i))", "(kernel 0 spin_ns (mod $i 2))",
                           "(kernel (mod $i 1) spin_ns 0)"}) {
    auto q = scn::load(loop(body), "differ.scn");
    BOOST_TEST(q->repeats.empty(), body);
    BOOST_TEST(q->steps.size() == 3u, body);
  }
  // An inner loop that reads the outer one's variable only: the inner
  // loop is read once in each outer iteration.
  auto q = scn::load(loop("(repeat 2 (var j) (kernel 0 spin_ns $i))"), "inner.scn");
  BOOST_TEST(q->steps.size() == 3u);
  BOOST_TEST(q->repeats.size() == 3u);
  BOOST_TEST(q->steps_run == 6u);
}

BOOST_AUTO_TEST_CASE(test_scenario_named_loop_iterations_load_once) {
  // Iterations that differ in the names they bind only (`(as k$i)`, and a
  // sync of the same iteration's event): the body is kept once, its names
  // as patterns, and every name resolves to its iteration's event.
  auto p = scn::load("(devices 2)\n"
                     "(repeat 1000 (kernel 0 spin_ns 0 (as k$i)) (kernel 1 spin_ns 0)\n"
                     "  (sync k$i))\n"
                     "(wait 1 k412)\n"
                     "(expect (state k999) done)\n"
                     "(expect (before k5 k6))\n",
                     "named.scn");
  BOOST_TEST(p->steps.size() == 3u + 3u);
  BOOST_TEST_REQUIRE(p->repeats.size() == 1u);
  BOOST_TEST(p->repeats[0].family == 0);
  BOOST_TEST(p->repeats[0].times == 1000u);
  BOOST_TEST(p->event_ids == 1000);
  BOOST_TEST(p->events.size() == 1u);
  BOOST_TEST(p->steps_run == 3003u);
  BOOST_TEST(p->steps[3].ev == 412);
  BOOST_TEST(p->event_name(412) == "k412");
  BOOST_TEST(p->items == (std::vector<uint64_t>{1000, 1001}), boost::test_tools::per_element());
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), scn::summary(r));
  BOOST_TEST(r.items == (std::vector<uint64_t>{1000, 1001}), boost::test_tools::per_element());
  BOOST_TEST(slice_of(r, "k999").end_ns > 0);
  // An outer loop around a named loop: a family per round, each name
  // looked up by its runs of digits (not against every pattern).
  auto rounds = scn::load("(devices 1)\n(repeat 2000 (var r) (repeat 5 (kernel 0 spin_ns 0 "
                          "(as k$r.$i))))\n(expect (state k1999.4) done)\n(wait 0 k7.3)\n",
                          "rounds.scn");
  BOOST_TEST(rounds->families.size() == 2000u);
  BOOST_TEST(rounds->steps.back().ev == 7 * 5 + 3);
  BOOST_TEST(rounds->event_name(1999 * 5 + 4) == "k1999.4");
  // Kernel arguments affine in the variable are kept once too, each
  // iteration's value set when it runs (and described with it).
  auto q = scn::load("(devices 1)\n(repeat 50 (kernel 0 spin_ns (+ (* 2 $i) 1) (as s$i)))\n"
                     "(expect (before s48 s49))\n",
                     "args.scn");
  BOOST_TEST_REQUIRE(q->repeats.size() == 1u);
  BOOST_TEST(q->steps[0].arg_steps.size() == 1u);
  auto rq = scn::run(*q);
  BOOST_TEST(rq.ok(), scn::summary(rq));
  BOOST_TEST(slice_of(rq, "s49").name == "spin_ns 99");
  // The load errors of the expanded loop, with their places: a name of an
  // iteration declared again (after the loop, or before it: the loop then
  // expands and fails at that iteration), one past the last iteration, a
  // number written otherwise, a fault aimed at none, a later iteration's
  // name inside the loop, a name that starts with a digit.
  auto e = error_of("(devices 1)\n(repeat 10 (kernel 0 spin_ns 0 (as k$i)))\n"
                    "(kernel 0 spin_ns 0 (as k5))\n");
  BOOST_TEST(e == "3:25: duplicate name 'k5': already an event declared at 2:36", e);
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as k5))\n"
               "(repeat 10 (kernel 0 spin_ns 0 (as k$i)))\n");
  BOOST_TEST(e == "3:36: duplicate name 'k5': already an event declared at 2:25", e);
  e = error_of("(devices 1)\n(repeat 20 (kernel 0 spin_ns 0 (as k$i)))\n"
               "(repeat 5 (kernel 0 spin_ns 0 (as k1$i)))\n");
  BOOST_TEST(e == "3:35: duplicate name 'k10': already an event declared at 2:36", e);
  e = error_of("(devices 1)\n(repeat 2 (var r) (repeat 3 (kernel 0 spin_ns 0 (as k$r.$i))))\n"
               "(repeat 3 (kernel 0 spin_ns 0 (as k$i.1)))\n");
  BOOST_TEST(e == "3:35: duplicate name 'k0.1': already an event declared at 2:53", e);
  e = error_of("(devices 1)\n(repeat 10 (kernel 0 spin_ns 0 (as k$i)))\n(sync k10)\n");
  BOOST_TEST(e == "3:7: unknown event 'k10'", e);
  e = error_of("(devices 1)\n(repeat 10 (kernel 0 spin_ns 0 (as k$i)))\n(sync k01)\n");
  BOOST_TEST(e == "3:7: unknown event 'k01'", e);
  e = error_of("(devices 1)\n(repeat 10 (kernel 0 spin_ns 0 (as k$i)))\n(fail-at k10 \"x\")\n");
  BOOST_TEST(e == "3:10: fail-at: unknown event 'k10': no step of the script makes it", e);
  e = error_of("(devices 1)\n(repeat 5 (kernel 0 spin_ns 0 (as a$i)) (sync a5))\n");
  BOOST_TEST(e == "2:47: unknown event 'a5'", e);
  e = error_of("(devices 1)\n(repeat 3 (kernel 0 spin_ns 0 (as $i)))\n");
  BOOST_TEST(e == "2:35: '0' cannot name an event: names start with a letter", e);
  e = error_of("(devices 1)\n(repeat 3 (kernel 0 spin_ns 0 (as a$i)))\n(context a1 0)\n");
  BOOST_TEST(e == "3:10: duplicate name 'a1': already an event declared at 2:35", e);
  e = error_of("(devices 1)\n(fail-at a2 \"boom\")\n(repeat 4 (kernel 0 spin_ns 0 (as a$i)))\n"
               "(delay-at a2 1ms)\n");
  BOOST_TEST(e == "4:1: delay-at: the task of event 'a2' already has a fault, (fail-at a2 boom) "
                  "at 2:1: a task takes one",
             e);
}

BOOST_AUTO_TEST_CASE(test_scenario_a_named_loop_runs_as_expanded) {
  // The same schedule twice: loops kept once (names and affine kernel
  // arguments from $i) and the loops expanded (spin_ns (mod 0 (+ $i 1)) is
  // 0 but is not affine), with faults aimed at single iterations before and
  // after the loop, a wait on the iteration's event, and an outer loop's
  // variable in the names. The logical traces (items, edges,
  // events' names, lines) and the verdicts are the same, and a failure no
  // expectation saw names its iteration's text.
  auto text = [](const std::string& zero) {
    return "(devices 3) (tnode v (floats 8)) (context c2 2) (alloc c2 v)\n"
           "(fail-at k3 \"boom\")\n"
           "(hold 0 (as h))\n"
           "(repeat 6 (kernel 0 spin_ns " + zero + " (as k$i)) (kernel 1 spin_ns 0 (as b$i.x))\n"
           "  (kernel 1 spin_ns (+ (* 1000 $i) 1)) (kernel c2 fill v $i))\n"
           "(release h)\n"
           "(delay-at b4.x 1ms)\n"
           "(repeat 2 (var r) (repeat 3 (kernel 2 spin_ns " + zero + " (as t$r.$i))))\n"
           "(cancel-at t1.1)\n"
           "(expect (state k2) done)\n"
           "(expect (before b4.x b5.x))\n"
           "(expect (sync t1.1) (fails (cancelled)))\n"
           "(expect (state t1.2) done)\n"
           "(fail-at w2 \"w\")\n"
           "(hold 2 (as h2))\n"
           "(repeat 4 (kernel 2 spin_ns " + zero + " (as w$i)) (wait 1 w$i) (kernel 1 spin_ns 0))\n"
           "(release h2)\n";
  };
  // (0 padded to the width of (mod 0 (+ $i 1)): the same columns.)
  auto once = scn::load(text("0               "), "named.scn");
  auto expanded = scn::load(text("(mod 0 (+ $i 1))"), "named.scn");
  BOOST_TEST(once->repeats.size() == 4u); // the loops, and each round's inner loop
  BOOST_TEST(once->families.size() == 4u);
  BOOST_TEST(expanded->repeats.empty());
  scn::run_options o;
  o.step_timeout_s = 20;
  auto a = scn::run(*once, o);
  auto b = scn::run(*expanded, o);
  BOOST_TEST(!a.ok()); // k3's fault, which no expectation saw
  BOOST_TEST(a.expectations.size() == b.expectations.size());
  for (std::size_t i = 0; i < std::min(a.expectations.size(), b.expectations.size()); ++i)
    BOOST_TEST(a.expectations[i].held == b.expectations[i].held, a.expectations[i].text);
  BOOST_TEST(scn::logical_trace(a) == scn::logical_trace(b));
  BOOST_TEST(a.items == b.items, boost::test_tools::per_element());
  BOOST_TEST_REQUIRE(a.unexpected.size() == b.unexpected.size());
  // The expanded run's, with its (mod 0 (+ $i 1)) written 0 (and the devices'
  // runner ids, which the second backend of the process numbers on).
  std::vector<std::string> texts, want;
  std::regex runner{R"(multidev_cpu:(\d+):\d+)"};
  for (const auto& u : a.unexpected)
    texts.push_back(std::regex_replace(u.where.str() + " " + u.text + ": " + u.observed,
                                       runner, "multidev_cpu:$1"));
  for (const auto& u : b.unexpected)
    want.push_back(std::regex_replace(
      std::regex_replace(u.where.str() + " " + u.text + ": " + u.observed,
                         std::regex{R"(\(mod 0 \(\+ \d+ 1\)\))"}, "0"),
      runner, "multidev_cpu:$1"));
  BOOST_TEST(texts == want, boost::test_tools::per_element());
  // Among them, iterations' kernels and a wait (whose item binds no event).
  BOOST_TEST(contains(fmt::format("{}", fmt::join(texts, "\n")),
                      "named.scn:4:11 (kernel 0 spin_ns 0 (as k4))"));
  BOOST_TEST(contains(fmt::format("{}", fmt::join(texts, "\n")), "(wait 1 w2)"));
}

BOOST_AUTO_TEST_CASE(test_scenario_a_loop_loaded_once_runs_as_expanded) {
  // The same schedule twice: loops read once (no loop variable), and loops
  // expanded (a variable that changes nothing: spin_ns (mod 0 (+ i 1)) is 0). The
  // logical traces, with every item, edge and line, are the same.
  // (An inner loop reads the outer variable: read once per outer round.)
  auto text = [](const std::string& zero_r, const std::string& zero_i) {
    return "(devices 2)\n(repeat 3 (var r)\n  (repeat 4 (kernel 0 spin_ns " + zero_i +
           "))\n  (all-work 0 (as round$r))\n  (wait 1 round$r)\n  (kernel 1 spin_ns " +
           zero_r + "))\n(repeat 5 (kernel 1 spin_ns " + zero_i + ") (sync round2))\n";
  };
  auto once = scn::load(text("0", "0"), "loops.scn");
  auto expanded = scn::load(text("(mod 0 (+ $r 1))", "(mod 0 (+ $i 1))"), "loops.scn");
  BOOST_TEST(once->repeats.size() == 4u); // each round's inner loop, and the last loop
  BOOST_TEST(expanded->repeats.empty());
  auto a = scn::run(*once);
  auto b = scn::run(*expanded);
  BOOST_TEST(a.ok(), scn::summary(a));
  BOOST_TEST(b.ok(), scn::summary(b));
  BOOST_TEST(scn::logical_trace(a) == scn::logical_trace(b));
  BOOST_TEST(a.items == b.items, boost::test_tools::per_element());
}

namespace {

/// The other outputs of `r` drawn from its record, as a run with
/// `run_options::timeline` false leaves them: the Chrome trace streamed,
/// the rest built when asked for.
scn::run_result undrawn(scn::run_result r) {
  r.tl = {};
  r.logical = {};
  return r;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_scenario_streamed_outputs_are_the_drawn_ones) {
  // Every example that runs on local devices, each output byte for byte.
  for (const char* name : {"pipeline.scn", "load.scn", "random_dag.scn", "gradient_merge.scn",
                           "fault_recovery.scn", "kill.scn", "cancel.scn", "timing.scn",
                           "aimed_faults.scn", "pools.scn", "contexts.scn", "deadlock.scn"}) {
    BOOST_TEST_CONTEXT(name) {
      auto p = scn::load_file(examples_dir() + name);
      auto r = scn::run(*p);
      BOOST_TEST_REQUIRE(!r.tl.slices.empty());
      auto s = undrawn(r);
      BOOST_TEST(s.tl.lanes.empty());
      std::ostringstream streamed;
      scn::write_chrome_trace(s, streamed);
      auto drawn = scn::chrome_trace_json(r);
      BOOST_TEST(streamed.str() == drawn);
      BOOST_TEST(scn::chrome_trace_json(s) == drawn);
      BOOST_TEST(scn::logical_trace(s) == scn::logical_trace(r));
      BOOST_TEST(scn::timeline_svg(s) == scn::timeline_svg(r));
      BOOST_TEST(scn::report(s).to_string() == scn::report(r).to_string());
    }
  }
  // A run without the timeline drawn leaves it to the outputs.
  auto p = scn::load_file(examples_dir() + "pipeline.scn");
  scn::run_options o;
  o.timeline = false;
  auto r = scn::run(*p, o);
  BOOST_TEST(r.tl.slices.empty());
  BOOST_TEST(r.logical.items().empty());
  auto doc = nlohmann::json::parse(scn::chrome_trace_json(r));
  BOOST_TEST(doc.at("traceEvents").size() > 10u);
}

namespace {

/// A field of /proc/self/status in bytes (`VmRSS`, `VmHWM`); 0 if absent.
std::size_t status_bytes(const std::string& key) {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line))
    if (starts_with(line, key + ":"))
      return static_cast<std::size_t>(std::stoull(line.substr(key.size() + 1))) * 1024;
  return 0;
}

/// Returns what the process's peak resident size grew by while `f` ran,
/// above its resident size when it began (the peak, VmHWM, reset first
/// through /proc/self/clear_refs; freed heap given back before).
template <class F>
std::size_t peak_growth(F f) {
  malloc_trim(0);
  {
    std::ofstream reset{"/proc/self/clear_refs"};
    reset << "5";
  }
  auto before = status_bytes("VmRSS");
  f();
  auto peak = status_bytes("VmHWM");
  return peak > before ? peak - before : 0;
}

/// A stream that counts what is written to it and keeps nothing.
struct counting_buf : std::streambuf {
  std::size_t bytes = 0;
  int_type overflow(int_type c) override {
    ++bytes;
    return c;
  }
  std::streamsize xsputn(const char*, std::streamsize n) override {
    bytes += static_cast<std::size_t>(n);
    return n;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

// A million steps (issue 42 point 1), against the same work through the C++
// API in this process: `(repeat N BODY)` then `AFTER`, where BODY is one
// kernel 0 spin_ns 0 and `after(n)` the forms after the loop.
template <class After>
void a_million_steps(const std::string& body, After after) {
  // Under a sanitizer, its allocator (redzones, a quarantine of freed
  // blocks) and its pace are not the program's: 100,000 steps, and only the
  // checks that do not read the resident size or the clock.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr bool sanitized = true;
#else
  constexpr bool sanitized = false;
#endif
  std::size_t n = sanitized ? 100'000 : 1'000'000;
  if (const char* e = std::getenv("MULTIDEV_SCENARIO_STEPS"))
    n = std::stoul(e);
  // The API: what the runner does per kernel (a fresh context, link, run),
  // on a backend with the runner's options (its trace rings sized alike).
  // A short queue for both: the items queued (a few hundred bytes each, the
  // runtime's) then weigh nothing beside a million steps, however far
  // ahead of its device either producer runs.
  constexpr std::size_t queue = 1024;
  double api_s = 0;
  auto api_bytes = peak_growth([&] {
    backend_options bo;
    bo.num_devices = 1;
    bo.on_destroy = backend_options::destroy_policy::cancel;
    bo.trace_capacity = 2 * n + 256;
    bo.queue_capacity = queue;
    backend b{bo};
    auto d = b.get_device(0);
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      auto r = b.link(b.make_context(d), "spin_ns", {int64_t{0}});
      r.schedule.description = "spin_ns 0";
      b.run(r);
    }
    b.await(d);
    api_s = seconds_since(t0);
  });
  auto script = fmt::format("(devices 1 (queue-capacity {}))\n(repeat {} {})\n"
                            "(expect (await 0) ok)\n{}",
                            queue, n, body, after(n));
  double load_s = 0, run_s = 0, trace_s = 0;
  std::size_t trace_bytes = 0;
  std::optional<scn::run_result> r;
  auto run_bytes = peak_growth([&] {
    auto t0 = std::chrono::steady_clock::now();
    auto p = scn::load(script, "million.scn");
    load_s = seconds_since(t0);
    scn::run_options o;
    o.timeline = false;
    t0 = std::chrono::steady_clock::now();
    r = scn::run(*p, o);
    run_s = seconds_since(t0);
  });
  BOOST_TEST(r->ok(), scn::summary(*r));
  BOOST_TEST(r->items.at(0) == n);
  BOOST_TEST(r->dropped_records == 0u);
  auto record_bytes = r->record_bytes;
  // --trace: streamed, in memory that does not grow with the run.
  auto trace_growth = peak_growth([&] {
    counting_buf buf;
    std::ostream out{&buf};
    auto t0 = std::chrono::steady_clock::now();
    scn::write_chrome_trace(*r, out);
    trace_s = seconds_since(t0);
    trace_bytes = buf.bytes;
  });
  auto per_step = [&](std::size_t bytes) { return static_cast<double>(bytes) / n; };
  BOOST_TEST_MESSAGE(fmt::format(
    "{} steps: load {:.3f} s ({:.3f} us/step), run {:.3f} s, C++ API {:.3f} s; peak memory "
    "{:.0f} B/step, the API's {:.0f} (the runtime's own), so {:.0f} B/step the runner's; its "
    "record {:.0f} B/step; --trace {:.3f} s, {} bytes, peak {} KiB",
    n, load_s, load_s * 1e6 / n, run_s, api_s, per_step(run_bytes), per_step(api_bytes),
    per_step(run_bytes) - per_step(api_bytes), per_step(record_bytes), trace_s, trace_bytes,
    trace_growth / 1024));
  // Memory, strictly: at most 300 B a step beyond the runtime's own (the
  // API run's peak, trace rings included); the runner's own accounting too.
  BOOST_TEST(per_step(record_bytes) <= 300.0);
  // The Chrome trace's text is ~185 B a step; writing it holds a buffer.
  BOOST_TEST(trace_bytes > 100 * n);
  if (sanitized)
    return;
  BOOST_TEST(per_step(run_bytes > api_bytes ? run_bytes - api_bytes : 0) <= 300.0);
  BOOST_TEST(trace_growth <= std::size_t{32} << 20);
  // Time, as ratios only a structural regression fails (per-step
  // allocation storms, O(n^2)); the figures are the bench's
  // (scenario_steps) and the log's.
  BOOST_TEST(load_s * 4 <= api_s); // a loop is not expanded step by step
  BOOST_TEST(load_s + run_s <= 20 * api_s);
  BOOST_TEST(trace_s <= 2 * (load_s + run_s));
}

// Its own ctest entry (test_scenario_million): it runs for seconds, so the
// test_scenario run leaves it out. Iterations all alike.
BOOST_AUTO_TEST_CASE(test_scenario_a_million_steps, *boost::unit_test::disabled()) {
  a_million_steps("(kernel 0 spin_ns 0)", [](std::size_t) { return std::string{}; });
}

// The same with iterations that differ: each kernel named after its
// iteration, with a fault aimed at one and references to earlier
// iterations' names after the loop (test_scenario_million too).
BOOST_AUTO_TEST_CASE(test_scenario_a_million_named_steps, *boost::unit_test::disabled()) {
  a_million_steps("(kernel 0 spin_ns 0 (as k$i))", [](std::size_t n) {
    return fmt::format("(delay-at k{} 1ms)\n(expect (before k{} k{}))\n(expect (state k5) done)\n"
                       "(wait 0 k{})\n(expect (sync k{}) ok)\n",
                       n / 2, n / 2, n / 2 + 1, n - 1, n - 1);
  });
}

// -- recorded rounds (issue 41 point 4) ------------------------------------------

BOOST_AUTO_TEST_CASE(test_scenario_round_replays_its_body_and_binds_the_latest_replay) {
  // w halves on device 0 at each replay and is added into g on device 1:
  // three replays give g = 0.5 + 0.25 + 0.125. The round's events are the
  // third replay's (a wait and before after the replays use them), and the
  // logical trace shows each replayed item with its replay's number.
  auto p = scn::load("(scenario r)\n(devices 2)\n(tnode w (floats 8))\n(tnode g (floats 8))\n"
                     "(context c0 0)\n(context c1 1)\n"
                     "(from-host c0 w (fill 1))\n(from-host c1 g (fill 0))\n"
                     "(round step\n"
                     "  (kernel c0 scale w 0.5 (as shrunk))\n"
                     "  (copy w (from c0) (to c1) (as sent))\n"
                     "  (kernel c1 axpy g 1 w (as summed)))\n"
                     "(replay step 3)\n"
                     "(wait 0 summed)\n"
                     "(kernel 0 spin_ns 0 (as after))\n"
                     "(to-host c1 g (as out))\n"
                     "(expect (state summed) done)\n"
                     "(expect (before shrunk sent))\n"
                     "(expect (before summed after))\n"
                     "(expect (host out) (all 0.875))\n",
                     "r.scn");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
  BOOST_TEST(r.expectations.size() == 4u);
  // 3 replays: device 0 its from-host, 3 scales, the wait's gate, the
  // kernel after; device 1 its from-host, 3 copies, 3 axpys, the to-host.
  BOOST_TEST(r.items[0] == 6u);
  BOOST_TEST(r.items[1] == 8u);
  auto text = scn::logical_trace(r);
  for (int k = 1; k <= 3; ++k) {
    BOOST_TEST(text.find(fmt::format("(description \"scale w 0.5 (round step)\") (replay {}) "
                                     "(event shrunk) (line 10)",
                                     k))
                 != std::string::npos,
               text);
    BOOST_TEST(text.find(fmt::format("(description \"axpy g 1 w (round step)\") (replay {}) "
                                     "(event summed) (line 12)",
                                     k))
                 != std::string::npos,
               text);
  }
  BOOST_TEST(text.find("(replay 4)") == std::string::npos, text);
  // The wait after the replays is on the third replay's axpy, device 1's
  // item 7.
  BOOST_TEST(text.find("(edge (from 1 7) (to 0 5) (kind wait))") != std::string::npos, text);
  // The same script gives the same logical trace.
  BOOST_TEST(scn::logical_trace(scn::run(*p)) == text);
}

BOOST_AUTO_TEST_CASE(test_scenario_a_replayed_failure_names_its_replay_round_and_item) {
  // Expected: the error carries the library's provenance. Not expected: the
  // run's unexpected failure names the replay and the round's step too.
  auto p = scn::load("(devices 2)\n"
                     "(round broken\n  (kernel 1 fail \"boom\" (as bad)))\n"
                     "(replay broken 1)\n"
                     "(expect (sync bad) (fails (matches \"^.*replay 1 of round 'broken', item "
                     "'bad': boom\") (origin 1)))\n",
                     "f.scn");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
  p = scn::load("(devices 2)\n"
                "(round broken\n  (kernel 1 spin_ns 0)\n  (kernel 1 fail \"boom\"))\n"
                "(replay broken 1)\n",
                "f.scn");
  r = scn::run(*p);
  BOOST_TEST(!r.ok());
  BOOST_TEST_REQUIRE(!r.unexpected.empty(), scn::summary(r));
  std::string all;
  for (const auto& u : r.unexpected)
    all += u.where.str() + ": " + u.text + ": " + u.observed + "\n";
  BOOST_TEST(all.find("f.scn:4:3: replay 1 of round 'broken': (kernel 1 fail boom): failed on "
                      "device 1: ")
               != std::string::npos,
             all);
  BOOST_TEST(all.find("replay 1 of round 'broken', item 'fail boom': boom") != std::string::npos,
             all);
}

BOOST_AUTO_TEST_CASE(test_scenario_round_events_are_not_made_until_a_replay) {
  auto p = scn::load("(devices 1)\n"
                     "(round step\n  (kernel 0 spin_ns 0 (as k)))\n"
                     "(expect (sync k) (fails (matches \"event 'k' was never made: it is an "
                     "item of round 'step', which no \\\\(replay step N\\\\) has run yet\")))\n"
                     "(replay step 2)\n"
                     "(expect (sync k) ok)\n",
                     "n.scn");
  auto r = scn::run(*p);
  BOOST_TEST(r.ok(), failed_expectations(r));
}

BOOST_AUTO_TEST_CASE(test_scenario_what_a_round_cannot_record_is_a_load_error_at_the_form) {
  auto in_round = [](const std::string& form) {
    return error_of("(devices 2)\n(tnode t (floats 4))\n(context c 0)\n(alloc c t)\n"
                    "(kernel 0 spin_ns 0 (as e))\n(round step\n  (kernel 1 spin_ns 0)\n  "
                    + form + ")\n");
  };
  const std::string tail = "; a round records kernel, checksum, delay, memset, copy and wait "
                           "forms (and repeat of them)";
  BOOST_TEST(in_round("(sync e)") == "8:3: (sync ...) cannot be recorded in round 'step' (at "
                                     "6:1): it waits on the host now; wait after (replay ...)"
                                       + tail);
  BOOST_TEST(in_round("(to-host c t (as h))")
             == "8:3: (to-host ...) cannot be recorded in round 'step' (at 6:1): it copies host "
                "memory now; copy before the round, or read the results after (replay ...)"
                  + tail);
  BOOST_TEST(starts_with(in_round("(from-host c t (fill 1))"),
                         "8:3: (from-host ...) cannot be recorded in round 'step'"));
  BOOST_TEST(in_round("(expect (sync e) ok)")
             == "8:3: (expect ...) cannot be recorded in round 'step' (at 6:1): expectations "
                "look at what ran; expect after (replay ...)"
                  + tail);
  BOOST_TEST(in_round("(alloc c t)")
             == "8:3: (alloc ...) cannot be recorded in round 'step' (at 6:1): it allocates or "
                "declares now; do it before the round"
                  + tail);
  BOOST_TEST(in_round("(round inner (kernel 0 spin_ns 0))")
             == "8:3: (round ...) cannot be recorded in round 'step' (at 6:1): rounds do not "
                "nest; record it before or after, and replay it outside"
                  + tail);
  BOOST_TEST(starts_with(in_round("(replay step 1)"),
                         "8:3: (replay ...) cannot be recorded in round 'step' (at 6:1): rounds "
                         "do not nest"));
  BOOST_TEST(starts_with(in_round("(fail-at e \"x\")"),
                         "8:3: (fail-at ...) cannot be recorded in round 'step' (at 6:1): "
                         "faults cannot be aimed inside a round"));
  BOOST_TEST(starts_with(in_round("(cancel 0)"),
                         "8:3: (cancel ...) cannot be recorded in round 'step' (at 6:1): it is "
                         "no item a replay can schedule again"));
  // Inside a repeat inside the round too, at the form.
  BOOST_TEST(starts_with(in_round("(repeat 2 (kernel 0 spin_ns 0) (sync e))"),
                         "8:34: (sync ...) cannot be recorded in round 'step'"));
  // A fault aimed from outside at an item of a round, before or after it.
  auto e = error_of("(devices 1)\n(round step\n  (kernel 0 spin_ns 0 (as k)))\n"
                    "(delay-at k 2ms)\n");
  BOOST_TEST(e == "4:11: delay-at: event 'k' is an item of round 'step' (at 2:1): faults cannot "
                  "be aimed inside a round (a (kernel D fail MESSAGE) in its body fails every "
                  "replay)");
  e = error_of("(devices 1)\n(fail-at k \"boom\")\n(round step\n  (kernel 0 spin_ns 0 (as k)))\n");
  BOOST_TEST(starts_with(e, "2:10: fail-at: event 'k' is an item of round 'step' (at 3:1)"), e);
  e = error_of("(devices 1)\n(round step)\n");
  BOOST_TEST(e == "2:1: round 'step' has no forms: give it the kernels, copies, waits... it "
                  "replays");
  e = error_of("(devices 1)\n(round step (repeat 0 (kernel 0 spin_ns 0)))\n");
  BOOST_TEST(e == "2:1: round 'step' records no items: its forms expanded to none (a (repeat 0 "
                  "...)?)");
  e = error_of("(devices 1)\n(kernel 0 spin_ns 0 (as step))\n(round step (kernel 0 spin_ns 0))\n");
  BOOST_TEST(e == "3:8: duplicate name 'step': already an event declared at 2:25");
}

BOOST_AUTO_TEST_CASE(test_scenario_a_bad_replay_is_a_load_error_at_its_place) {
  const std::string head = "(devices 1)\n(kernel 0 spin_ns 0 (as e))\n"
                           "(round step (kernel 0 spin_ns 0))\n";
  BOOST_TEST(error_of(head + "(replay nothing 2)\n") == "4:9: unknown round 'nothing'");
  BOOST_TEST(error_of(head + "(replay e 2)\n")
             == "4:9: 'e' is an event (declared at 2:25), expected a round");
  BOOST_TEST(error_of(head + "(replay step 0)\n")
             == "4:14: the number of replays must be between 1 and 2000000, got 0");
  BOOST_TEST(error_of(head + "(replay step -3)\n")
             == "4:14: the number of replays must be between 1 and 2000000, got -3");
  BOOST_TEST(starts_with(error_of(head + "(replay step many)\n"),
                         "4:14: the number of replays must be a whole number, got 'many'"));
  BOOST_TEST(starts_with(error_of(head + "(replay step)\n"), "4:1: (replay ...) takes 2 arguments"));
  // A round must come before its replays.
  BOOST_TEST(error_of("(devices 1)\n(replay later 1)\n(round later (kernel 0 spin_ns 0))\n")
             == "2:9: unknown round 'later'");
}

BOOST_AUTO_TEST_CASE(test_scenario_a_wait_in_a_round_on_pending_work_outside_is_refused_there) {
  // A replay could not tell whether to wait for it again: the library
  // refuses it, a script error at the wait, not at the round.
  auto p = scn::load("(devices 2)\n(hold 0 (as h))\n(kernel 0 spin_ns 0 (as outside))\n"
                     "(round step\n  (kernel 1 spin_ns 0)\n  (wait 1 outside))\n",
                     "w.scn");
  try {
    scn::run(*p);
    BOOST_FAIL("no script error");
  } catch (const scn::script_error& e) {
    BOOST_TEST(e.where().line == 6);
    BOOST_TEST(e.where().column == 3);
    BOOST_TEST(e.message().find("in round 'step': will_wait_for: cannot be recorded in round "
                                "'step'")
                 != std::string::npos,
               e.message());
  }
}
