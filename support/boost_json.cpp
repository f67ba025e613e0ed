// The one translation unit that compiles Boost.JSON (header-only mode), for every
// library that reads or writes JSON (statepool::boost_json: the planner, eval).
#include <boost/json/src.hpp>
