"""Enum choices: which option a request's own words name, and when none is chosen."""

from services.engine.choices import choose, enum_choices, words

RUN = ["run_workflow", "rerun_workflow_run", "rerun_failed_jobs", "cancel_workflow_run", "delete_workflow_run_logs"]
PART = ["request-headers", "request-body", "response-headers", "response-body"]


def test_words_split_identifiers_stem_lightly_and_drop_numbers():
    assert words("CREATED_AT") == ["creat", "at"]
    assert words("what filesystems does it report") == ["what", "filesystem", "doe", "it", "report"]
    assert words("list_workflow_runs getDiff") == ["list", "workflow", "run", "get", "diff"]
    assert words("v2.8.1 +1 -1") == ["v2"]  # a bare number is no word: "-1" must not match "v2.8.1"


def test_an_option_named_by_the_request_is_chosen():
    assert choose(["get", "get_diff", "get_files"], "Show me the diff for acme-corp/billing-service#57.") == "get_diff"
    assert choose(RUN, "that one's stuck, cancel it") == "cancel_workflow_run"
    assert choose(["all", "filesystem", "os"], "what filesystems and disk usage does the guest report?") == "filesystem"
    assert choose(["CREATED_AT", "UPDATED_AT"], "discussions in vercel/next.js ordered by creation") == "CREATED_AT"
    # fewer unmatched words wins a tie on matches: "get" for "get the PR", get_diff for "get the diff"
    assert choose(["get", "get_diff"], "get the PR") == "get"
    assert choose(["get", "get_diff"], "get the diff") == "get_diff"


def test_sort_order_options_match_their_usual_wordings():
    assert choose(["asc", "desc"], "sorted by creation date, newest first") == "desc"
    assert choose(["ASC", "DESC"], "oldest first please") == "ASC"
    assert choose(["asc", "desc"], "the latest release notes") == "desc"
    assert choose(["asc", "desc"], "sort them by name") is None


def test_no_choice_on_a_tie_on_no_match_or_without_a_real_choice():
    # "request #3 ... the response body": request-body and response-body match two words each
    assert choose(PART, "What did the server send back for request #3? Just the response body.") is None
    assert choose(["+1", "-1", "laugh"], "Give a thumbs up on v2.8.1") is None
    assert choose(["open", "closed"], "list the issues") is None
    assert choose(["only"], "only this") is None  # a single option is the grammar's, not a choice
    assert choose([1, 2, "x"], "pick x") is None
    assert choose(RUN, "   ") is None


def test_enum_choices_covers_top_level_enum_parameters_only():
    schema = {"type": "object", "properties": {
        "method": {"type": "string", "enum": ["get", "get_diff"]},
        "state": {"type": "string", "enum": ["open", "closed", "all"]},
        "title": {"type": "string"},
        "opts": {"type": "object", "properties": {"mode": {"enum": ["diff", "full"]}}},
    }}
    assert enum_choices(schema, "the diff of the closed PR") == {"method": "\"get_diff\"", "state": "\"closed\""}
    assert enum_choices(schema, "hello") == {}
    assert enum_choices(None, "diff") == {} and enum_choices({"properties": None}, "diff") == {}


def test_a_flag_the_request_names_is_true_unless_negated_just_before_or_set_false():
    from services.engine.choices import flag

    assert flag("errorPath", "use the error path (-32042) instead of elicitation") is True
    assert flag("all_namespaces", "Which pods are hogging memory in all namespaces?") is True
    assert flag("boxes", "the page structure with element refs, and include bounding boxes") is True
    assert flag("recursive", "only paths under packages/, top level only (not recursive)") is False
    assert flag("draft", "octo-org/web-app#430 is ready for eyes now, take it out of draft") is False
    assert flag("draft", "un-draft PR saltmarsh/tide-api#66") is False
    assert flag("submit", "Put SPRING25 in there, but don't submit yet.") is False
    assert flag("all_namespaces", "Helm releases in platform-addons only, with all_namespaces set to false.") is False
    assert flag("public", "Save that as myip.py in a private gist described as 'public IP helper'.") is None
    assert flag("failed_only", "logs of all the failed jobs") is None  # not every word of the name
    assert flag("x", "anything") is None  # a name of one character has no word


def test_enum_choices_gives_booleans_as_json_literals():
    schema = {"properties": {"draft": {"type": "boolean"}, "title": {"type": "string"}}}
    assert enum_choices(schema, "open it as a draft") == {"draft": "true"}
    assert enum_choices(schema, "it is not a draft anymore") == {"draft": "false"}
    assert enum_choices(schema, "hello") == {}


def test_words_after_a_negation_are_not_asked_for():
    from services.engine.choices import asked_words

    assert asked_words("give me the full resource inline, not a link") == ["give", "me", "the", "full", "resource",
                                                                           "inline"]
    opts = ["resource", "resourceLink"]
    assert choose(opts, "Shrink it and give me the full resource inline, not a link.") == "resource"
    assert choose(opts, "the full resource object instead of a link") == "resource"
    assert choose(opts, "just a resource link please") == "resourceLink"
    assert choose(["deployment", "pod"], "roll out the deployment") == "deployment"  # "out" is no negation here
