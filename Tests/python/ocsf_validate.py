#!/usr/bin/python3
"""Checks OCSF events against an OCSF schema source tree (ocsf-schema at a tag: dictionary.json, categories.json,
events/, objects/, profiles/). Usage: ocsf_validate.py SCHEMA_DIR EVENTS_FILE, one JSON object a line.

A class or object is its `extends` chain merged from the root down, each level's `$include`s first and its own
attributes over them; an included profile's attributes count only when the event claims that profile in
metadata.profiles (an attribute a class restates with "profile": null is the class's own). Each event is checked for:
its class from class_uid; every required attribute, recursively into objects; no attribute the class or object does
not define; the dictionary's type of every value (strings, 32-bit integers, 64-bit longs, timestamps in milliseconds,
booleans, arrays, objects, and the regular expressions and ranges of the derived types); every enum value (the
dictionary's merged with each level's); captions in the sibling strings; at_least_one and just_one constraints;
class_uid, category_uid and type_uid as the schema derives them.

Prints one line per problem, "line N: PATH: PROBLEM", then "N event(s) checked, M problem(s)"; exits 1 on any problem.
"""
import json
import os
import re
import sys

schema_dir, events_file = sys.argv[1], sys.argv[2]


def load(path):
    with open(os.path.join(schema_dir, path)) as f:
        return json.load(f)


dictionary = load("dictionary.json")
types = dictionary["types"]["attributes"]
attribute_dictionary = dictionary["attributes"]
categories = load("categories.json")["attributes"]
profiles_known = {name[:-5] for name in os.listdir(os.path.join(schema_dir, "profiles")) if name.endswith(".json")}


def tree(folder):
    items = {}
    for root, _, files in os.walk(os.path.join(schema_dir, folder)):
        for name in files:
            if name.endswith(".json"):
                with open(os.path.join(root, name)) as f:
                    item = json.load(f)
                items[item["name"]] = item
    return items


classes, objects = tree("events"), tree("objects")


def merge(base, over):
    merged = dict(base)
    for key, value in over.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def resolve(name, table, cache={}):
    """(attributes, constraints, profiles, category) of a class or object, its extends chain applied."""
    key = (id(table), name)
    if key in cache:
        return cache[key]
    item = table[name]
    if "extends" in item:
        attributes, constraints, profiles, category = resolve(item["extends"], table)
        attributes = dict(attributes)
    else:
        attributes, constraints, profiles, category = {}, {}, set(), None
    own = item.get("attributes", {})
    includes = own.get("$include", [])
    for path in [includes] if isinstance(includes, str) else includes:
        included = load(path)
        profile = included["name"] if included.get("meta") == "profile" else None
        for attribute, spec in included.get("attributes", {}).items():
            if attribute in attributes and attributes[attribute].get("profile") is None:
                spec = merge(spec, {"profile": None})
            elif profile is not None:
                spec = merge(spec, {"profile": profile})
            attributes[attribute] = merge(attributes.get(attribute, {}), spec)
    for attribute, spec in own.items():
        if attribute != "$include":
            attributes[attribute] = merge(attributes.get(attribute, {}), spec)
    result = (attributes, item.get("constraints", constraints), profiles | set(item.get("profiles", [])),
              item.get("category", category))
    cache[key] = result
    return result


class_by_uid = {}
for class_name, item in classes.items():
    if "uid" in item:
        category = resolve(class_name, classes)[3]
        class_by_uid[categories[category]["uid"] * 1000 + item["uid"]] = class_name


def base_type(type_name):
    """The chain of a derived type down to its base, e.g. timestamp_t → long_t."""
    chain = [type_name]
    while "type" in types.get(chain[-1], {}):
        chain.append(types[chain[-1]]["type"])
    return chain


def check_scalar(value, type_name, path, problems):
    chain = base_type(type_name)
    base = chain[-1]
    is_integer = isinstance(value, int) and not isinstance(value, bool)
    if base == "string_t" and not isinstance(value, str):
        return problems.append(f"{path}: {json.dumps(value)} is not a string ({type_name})")
    if base == "integer_t" and not (is_integer and -2**31 <= value < 2**31):
        return problems.append(f"{path}: {json.dumps(value)} is not an integer ({type_name})")
    if base == "long_t" and not (is_integer and -2**63 <= value < 2**63):
        return problems.append(f"{path}: {json.dumps(value)} is not a long ({type_name})")
    if base == "float_t" and not (is_integer or isinstance(value, float)):
        return problems.append(f"{path}: {json.dumps(value)} is not a number ({type_name})")
    if base == "boolean_t" and not isinstance(value, bool):
        return problems.append(f"{path}: {json.dumps(value)} is not a boolean ({type_name})")
    for derived in chain[:-1]:
        spec = types[derived]
        if "regex" in spec and not re.search(spec["regex"], value):
            problems.append(f"{path}: {json.dumps(value)} does not match {derived}'s pattern")
        if "max_len" in spec and len(value) > spec["max_len"]:
            problems.append(f"{path}: {json.dumps(value)} is longer than {derived}'s {spec['max_len']}")
        if "range" in spec and not spec["range"][0] <= value <= spec["range"][1]:
            problems.append(f"{path}: {value} is outside {derived}'s range {spec['range']}")
    # Milliseconds since 1970 between 2001 and 2100: a time in seconds or microseconds is out by a factor of 1000.
    if "timestamp_t" in chain and not 10**12 <= value < 4102444800000:
        problems.append(f"{path}: {value} is not a time in milliseconds since 1970")


def check_object(value, name, table, path, claimed, problems, derived=frozenset()):
    if not isinstance(value, dict):
        return problems.append(f"{path or '.'}: {json.dumps(value)} is not an object ({name})")
    attributes, constraints, _, _ = resolve(name, table)
    applies = {attribute: spec for attribute, spec in attributes.items() if spec.get("profile") in (None, *claimed)}
    prefix = path + "." if path else ""
    for attribute, spec in sorted(applies.items()):
        if spec.get("requirement") == "required" and value.get(attribute) is None:
            problems.append(f"{prefix}{attribute}: required by {name}, missing")
    for attribute in sorted(set(value) - set(applies)):
        if attribute in attributes:
            problems.append(f"{prefix}{attribute}: belongs to the profile {attributes[attribute]['profile']}, "
                            f"not claimed in metadata.profiles")
        else:
            problems.append(f"{prefix}{attribute}: not an attribute of {name}")
    for attribute in sorted(set(value) & set(applies)):
        spec = merge(attribute_dictionary.get(attribute, {}), applies[attribute])
        if attribute in derived:
            spec.pop("enum", None)
        check_value(value[attribute], attribute, spec, value, prefix + attribute, claimed, problems)
    if constraints.get("at_least_one") and not any(value.get(a) is not None for a in constraints["at_least_one"]):
        problems.append(f"{path or '.'}: {name} needs at least one of {', '.join(constraints['at_least_one'])}")
    if constraints.get("just_one") and sum(value.get(a) is not None for a in constraints["just_one"]) != 1:
        problems.append(f"{path or '.'}: {name} needs exactly one of {', '.join(constraints['just_one'])}")


def check_value(value, attribute, spec, parent, path, claimed, problems):
    type_name = spec.get("type")
    if type_name is None:
        return problems.append(f"{path}: the dictionary has no type for {attribute}")
    if spec.get("is_array"):
        if not isinstance(value, list):
            return problems.append(f"{path}: {json.dumps(value)} is not an array")
        for index, element in enumerate(value):
            check_value(element, attribute, {**spec, "is_array": False}, parent, f"{path}[{index}]", claimed, problems)
        return
    if type_name == "object":
        if not isinstance(value, dict):
            problems.append(f"{path}: {json.dumps(value)} is not an object")
        return
    if type_name == "json_t":
        return
    if type_name in objects:
        return check_object(value, type_name, objects, path, claimed, problems)
    before = len(problems)
    check_scalar(value, type_name, path, problems)
    enum = spec.get("enum")
    if enum and len(problems) == before:
        if str(value) not in enum:
            problems.append(f"{path}: {json.dumps(value)} is not one of {', '.join(sorted(enum, key=int_or_text))}")
        elif "sibling" in spec and spec["sibling"] in parent and value != 99 \
                and parent[spec["sibling"]] != enum[str(value)]["caption"]:
            problems.append(f"{path[:len(path) - len(attribute)]}{spec['sibling']}: {json.dumps(parent[spec['sibling']])} "
                            f"is not the caption of {attribute} {value}, {json.dumps(enum[str(value)]['caption'])}")


def int_or_text(key):
    return (0, int(key), "") if key.lstrip("-").isdigit() else (1, 0, key)


def check_event(event):
    if not isinstance(event, dict):
        return [f".: {json.dumps(event)} is not an object"]
    class_uid = event.get("class_uid")
    if class_uid not in class_by_uid:
        return ["class_uid: required by base_event, missing" if class_uid is None
                else f"class_uid: {json.dumps(class_uid)} is no class of this schema"]
    name = class_by_uid[class_uid]
    attributes, _, class_profiles, category = resolve(name, classes)
    problems = []
    claimed = (event.get("metadata") or {}).get("profiles") or []
    for profile in claimed if isinstance(claimed, list) else []:
        if profile not in profiles_known:
            problems.append(f"metadata.profiles: {json.dumps(profile)} is no profile of this schema")
        elif profile not in class_profiles:
            problems.append(f"metadata.profiles: {json.dumps(profile)} does not apply to {name}")
    # The schema derives these from the class and the activity; its source gives their enums only for base_event.
    derived = {"class_uid": class_uid, "category_uid": categories[category]["uid"]}
    activity_id = event.get("activity_id")
    activities = merge(attribute_dictionary["activity_id"].get("enum", {}), attributes["activity_id"].get("enum", {}))
    if isinstance(activity_id, int):
        derived["type_uid"] = class_uid * 100 + activity_id
    captions = {"class_name": classes[name]["caption"], "category_name": categories[category]["caption"]}
    if str(activity_id) in activities:
        captions["type_name"] = f"{classes[name]['caption']}: {activities[str(activity_id)]['caption']}"
    for attribute, expected in list(derived.items()) + list(captions.items()):
        if attribute in event and event[attribute] != expected:
            problems.append(f"{attribute}: {json.dumps(event[attribute])}, but {name} makes it {json.dumps(expected)}")
    check_object(event, name, classes, "", claimed if isinstance(claimed, list) else [], problems, derived=set(derived))
    return problems


count = total = 0
with open(events_file) as f:
    for number, line in enumerate(f, 1):
        count += 1
        try:
            event = json.loads(line)
        except ValueError as error:
            problems = [f".: not JSON: {error}"]
        else:
            problems = check_event(event)
        for problem in problems:
            print(f"line {number}: {problem}")
        total += len(problems)
print(f"{count} event(s) checked, {total} problem(s)")
sys.exit(1 if total else 0)
