// Source lines the reports in this folder point at (never compiled):
// tests/tsan_classify.sh checks scripts/tsan-classify.py against them.
struct sample_state {
  int* counter = new int(0);
};
void touch(sample_state& s) { ++*s.counter; }
auto make_closure(sample_state& s) { return [&s] { touch(s); }; }
