# The public/private line, seen from the build: which sources reach past the
# public headers in include/.
#
# A header is internal when it lives under the source root but not under
# include/ (actors/, devices/, messages/). A public header that still
# includes an internal one is "leaky" (multidev/protocol.hpp while the
# protocol moves into include/): its users need the source root as well, and
# configure says so, until the header is fixed and the list is empty.

set(MULTIDEV_SOURCE_ROOT "${PROJECT_SOURCE_DIR}")
set(MULTIDEV_PUBLIC_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/include")

# multidev_internal_includes(<out> <file>): the internal headers <file> includes.
function(multidev_internal_includes out file)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]+[\">]")
  set(found)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" header "${line}")
    if(EXISTS "${MULTIDEV_SOURCE_ROOT}/${header}"
       AND NOT EXISTS "${MULTIDEV_PUBLIC_INCLUDE_DIR}/${header}")
      list(APPEND found "${header}")
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# The leaky public headers, as included: "multidev/x.hpp".
file(GLOB_RECURSE _multidev_public_headers CONFIGURE_DEPENDS
     RELATIVE "${MULTIDEV_PUBLIC_INCLUDE_DIR}" "${MULTIDEV_PUBLIC_INCLUDE_DIR}/multidev/*.hpp")
set(MULTIDEV_LEAKY_PUBLIC_HEADERS)
foreach(h IN LISTS _multidev_public_headers)
  multidev_internal_includes(_internal "${MULTIDEV_PUBLIC_INCLUDE_DIR}/${h}")
  if(_internal)
    list(APPEND MULTIDEV_LEAKY_PUBLIC_HEADERS "${h}")
    message(STATUS "multidev: public header ${h} still includes ${_internal}; "
                   "its users get the source root on their include path for now")
  endif()
endforeach()

# multidev_classify_source(<file> <white_box_var> <needs_root_var>):
#   white_box: <file> includes an internal header itself;
#   needs_root: it needs the source root on its include path (white box, or
#   it includes a leaky public header).
function(multidev_classify_source file white_box_var needs_root_var)
  multidev_internal_includes(internal "${file}")
  set(white_box FALSE)
  set(needs_root FALSE)
  if(internal)
    set(white_box TRUE)
    set(needs_root TRUE)
  else()
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include")
    foreach(h IN LISTS MULTIDEV_LEAKY_PUBLIC_HEADERS)
      string(REPLACE "." "\\." h_regex "${h}")
      if(lines MATCHES "[\"<]${h_regex}[\">]")
        set(needs_root TRUE)
      endif()
    endforeach()
  endif()
  set(${white_box_var} ${white_box} PARENT_SCOPE)
  set(${needs_root_var} ${needs_root} PARENT_SCOPE)
endfunction()

# multidev_public_headers_only(<target>...): refuses (at configure time) a
# target whose sources include internal headers, and gives the source root to
# those that include a leaky public header. For tools and examples.
function(multidev_public_headers_only)
  foreach(target IN LISTS ARGN)
    get_target_property(sources ${target} SOURCES)
    get_target_property(dir ${target} SOURCE_DIR)
    foreach(src IN LISTS sources)
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY "${dir}")
      multidev_classify_source("${src}" white_box needs_root)
      if(white_box)
        message(FATAL_ERROR "${src} (target ${target}) includes an internal header; "
                            "tools and examples use include/multidev/ only")
      endif()
      if(needs_root)
        target_include_directories(${target} PRIVATE "${MULTIDEV_SOURCE_ROOT}")
      endif()
    endforeach()
  endforeach()
endfunction()
