# The public/private line, seen from the build: which sources reach past the
# public headers in include/.
#
# A header is internal when it lives in the library's own folders (actors/,
# devices/, messages/). The scenario runner's headers (scenario/) are
# neither: a layer above the public API that the tool and tests use. Public headers include nothing
# internal (configure fails otherwise), tools and examples use public headers
# only, and tests that include internals are white-box tests.

set(MULTIDEV_SOURCE_ROOT "${PROJECT_SOURCE_DIR}")
set(MULTIDEV_PUBLIC_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/include")

# multidev_internal_includes(<out> <file>): the internal headers <file> includes.
function(multidev_internal_includes out file)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]+[\">]")
  set(found)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" header "${line}")
    if(EXISTS "${MULTIDEV_SOURCE_ROOT}/${header}"
       AND header MATCHES "^(actors|devices|messages)/")
      list(APPEND found "${header}")
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Every public header includes public headers only.
file(GLOB_RECURSE _multidev_public_headers CONFIGURE_DEPENDS
     "${MULTIDEV_PUBLIC_INCLUDE_DIR}/multidev/*.hpp")
foreach(h IN LISTS _multidev_public_headers)
  multidev_internal_includes(_internal "${h}")
  if(_internal)
    message(FATAL_ERROR "public header ${h} includes internal headers: ${_internal}")
  endif()
endforeach()

# multidev_is_white_box(<file> <out>): whether <file> includes an internal header.
function(multidev_is_white_box file out)
  multidev_internal_includes(internal "${file}")
  if(internal)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# multidev_public_headers_only(<target>...): refuses (at configure time) a
# target whose sources include internal headers. For tools and examples.
function(multidev_public_headers_only)
  foreach(target IN LISTS ARGN)
    get_target_property(sources ${target} SOURCES)
    get_target_property(dir ${target} SOURCE_DIR)
    foreach(src IN LISTS sources)
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY "${dir}")
      multidev_is_white_box("${src}" white_box)
      if(white_box)
        message(FATAL_ERROR "${src} (target ${target}) includes an internal header; "
                            "tools and examples use include/multidev/ only")
      endif()
    endforeach()
  endforeach()
endfunction()
