"""AWX's survey rules, for the job templates of awx/: which fields a survey may hold, and how AWX checks answers.

Taken from AWX (ansible/awx, tag 24.6.1, the awx.awx version pinned for configure.yml), not invented:
- the fields of a survey and of a question, and the question types: awx/api/templates/api/job_template_survey_spec.md
  and JobTemplateSurveySpec._validate_spec_data in awx/api/views/__init__.py (what POST .../survey_spec/ accepts);
- the checks of answers and the defaults of unanswered questions: SurveyJobTemplateMixin._survey_element_validation
  and _update_unified_job_kwargs in awx/main/models/mixins.py.
"""
from dflash_ops.errors import InputError

SURVEY_FIELDS = {"name": str, "description": str, "spec": list}
# question field -> types AWX accepts there ('' is AWX's "not set" for min/max/choices/default)
QUESTION_FIELDS = {"question_name": str, "question_description": str, "variable": str, "type": str,
                   "required": bool, "default": object, "choices": (list, str), "min": (int, str, type(None)),
                   "max": (int, str, type(None)), "new_question": bool}
QUESTION_REQUIRED = ("question_name", "variable", "type", "required")
QUESTION_TYPES = {"text": str, "textarea": str, "password": str, "multiplechoice": str, "multiselect": str,
                  "integer": int, "float": (float, int)}


def _choices(question):
    choices = question.get("choices", [])
    return [c for c in choices.splitlines() if c.strip()] if isinstance(choices, str) else list(choices)


def spec_errors(survey):
    """What POST .../survey_spec/ would refuse in a survey (AWX's checks plus: no field AWX does not know)."""
    errors = []
    for field, kind in SURVEY_FIELDS.items():
        if not isinstance(survey.get(field), kind):
            errors.append("field %r missing or not a %s" % (field, kind.__name__))
    errors += ["unknown survey field %r" % k for k in survey if k not in SURVEY_FIELDS]
    if not errors and not survey["spec"]:
        errors.append("'spec' doesn't contain any items")
    seen = set()
    for idx, q in enumerate(survey.get("spec") or []):
        errors += ["question %d: unknown field %r" % (idx, k) for k in q if k not in QUESTION_FIELDS]
        errors += ["question %d: %r missing" % (idx, k) for k in QUESTION_REQUIRED if k not in q]
        errors += ["question %d: %r has the wrong type (%r)" % (idx, k, q[k]) for k in q
                   if k in QUESTION_FIELDS and not isinstance(q[k], QUESTION_FIELDS[k])]
        if q.get("variable") in seen:
            errors.append("question %d: variable %r duplicated" % (idx, q["variable"]))
        seen.add(q.get("variable"))
        qtype = q.get("type")
        if qtype not in QUESTION_TYPES:
            errors.append("question %d: type %r is not one of %s" % (idx, qtype, ", ".join(QUESTION_TYPES)))
            continue
        default = q.get("default", "")
        if default != "" and not isinstance(default, QUESTION_TYPES[qtype]):
            errors.append("question %d: default %r is not a %s" % (idx, default, qtype))
        errors += ["question %d: %s limit %r is not an integer" % (idx, k, q[k]) for k in ("min", "max")
                   if q.get(k) not in ("", None) and not isinstance(q[k], int)]
        if qtype in ("multiplechoice", "multiselect"):
            if "choices" not in q:
                errors.append("question %d of type %s must specify choices" % (idx, qtype))
            defaults = [d for d in default.splitlines() if d.strip()] if isinstance(default, str) else default
            if qtype == "multiplechoice" and len(defaults) > 1:
                errors.append("question %d: multiple choice can only have one default" % idx)
            if any(d not in _choices(q) for d in defaults):
                errors.append("question %d: default must be one of the choices" % idx)
    return errors


def answer_errors(question, answers):
    """AWX's check of one question's answer in answers (a dict), in AWX's words."""
    var, qtype = question["variable"], question["type"]
    if var not in answers:
        return ["'%s' value missing" % var] if question["required"] else []
    value = answers[var]
    lo, hi = (question.get(k) for k in ("min", "max"))
    if qtype in ("text", "textarea", "password", "integer", "float"):
        kinds = {"integer": int, "float": (float, int)}.get(qtype, str)
        if not isinstance(value, kinds) or isinstance(value, bool):
            return ["Value %r for '%s' expected to be %s." % (value, var, {"integer": "an integer", "float": "a float"}
                                                               .get(qtype, "a string"))]
        size = len(value) if isinstance(value, str) else value
        what = "length is %d, " % size if isinstance(value, str) else ""
        if lo not in ("", None) and size < int(lo):
            return ["'%s' value %r is too small (%smust be at least %s)." % (var, value, what, lo)]
        if hi not in ("", None) and size > int(hi):
            return ["'%s' value %r is too large (must be no more than %s)." % (var, value, hi)]
    elif qtype == "multiplechoice" and value not in _choices(question):
        return ["Value %r for '%s' expected to be one of %s." % (value, var, _choices(question))]
    elif qtype == "multiselect" and (not isinstance(value, list) or any(v not in _choices(question) for v in value)):
        return ["Value %r for '%s' expected to be a list of %s." % (value, var, _choices(question))]
    return []


def resolve_answers(template, answers):
    """The extra vars AWX would pass for these answers: refused as AWX refuses them; unanswered questions get their
    default where the default itself passes (AWX's rule: an empty default adds nothing)."""
    asked = [q["variable"] for q in template.questions]
    unknown = sorted(set(answers) - set(asked))
    if unknown:
        raise InputError("%s does not ask %s: its survey asks %s" % (template.name, ", ".join(unknown),
                                                                    ", ".join(asked) or "nothing"))
    resolved = dict(answers)
    for q in template.questions:
        if q["variable"] not in resolved and "default" in q and not answer_errors(q, {q["variable"]: q["default"]}):
            resolved[q["variable"]] = q["default"]
    errors = [e for q in template.questions for e in answer_errors(q, resolved)]
    if errors:
        raise InputError("answer refused by the survey of %s: %s" % (template.name, " ".join(errors)))
    return resolved
